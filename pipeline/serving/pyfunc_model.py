"""The MLflow pyfunc, logged "from code" by the register stage (no pickle): see :mod:`pipeline.serving`.

Artifact ``model_dir`` is ``models/finetuned``; ``model_config`` carries the tokenizer settings.
Only MLflow executes this file (it ends with ``set_model``); the serving logic is ``Predictor``.
"""

import logging
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd

from pipeline.serving.service import InputError, Predictor


class MultiTaskPyfunc(mlflow.pyfunc.PythonModel):
    """Raw-text requests for every task type -> :class:`pipeline.serving.service.Predictor`; bad rows -> HTTP 400."""

    def load_context(self, context: Any) -> None:
        cfg = context.model_config or {}
        self.predictor = Predictor(
            Path(context.artifacts["model_dir"]),
            int(cfg.get("max_seq_length", 128)),
            int(cfg.get("doc_stride", 32)),
            int(cfg.get("batch_size", 32)),
            str(cfg.get("precision", "auto")),
            cfg.get("max_request_chars"),  # models logged before the limit have none
        )

    # A DataFrame hint: MLflow infers no schema from it (the logged signature is explicit) and does not warn.
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        from mlflow.exceptions import MlflowException
        from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, INVALID_PARAMETER_VALUE

        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        try:
            return self.predictor.predict(frame)
        except InputError as err:  # a 400 with the message, not a 500, from the scoring server
            raise MlflowException(str(err), error_code=INVALID_PARAMETER_VALUE) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # the Rust tokenizers panic with a BaseException; the trace goes to the log only
            # MLflow's scoring server would send the client the whole traceback (install paths and all)
            logging.getLogger(__name__).exception("adaptbert: unexpected error answering a request")
            raise MlflowException(
                f"internal error ({type(err).__name__}) answering the request; the server's log has the details",
                error_code=INTERNAL_ERROR,
            ) from None


mlflow.models.set_model(MultiTaskPyfunc())
