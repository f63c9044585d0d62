"""The pyfunc model file MLflow logs ("models from code", no pickle): see :mod:`pipeline.serving`."""

import mlflow

from pipeline.serving import MultiTaskPyfunc

mlflow.models.set_model(MultiTaskPyfunc())
