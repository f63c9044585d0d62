"""A team's stack on this machine: PostgreSQL, an S3 endpoint, MLflow and Prefect servers on them, a Prefect worker.

    python -m tools.team_stack up      # ~30 s; then `. .team-stack/env.sh` and run the pipeline as docs/team.md says
    python -m tools.team_stack status
    python -m tools.team_stack down

What a team runs on its servers (docs/team.md), started as child processes of one state folder (``.team-stack/``,
git- and DVC-ignored): a private PostgreSQL 15 cluster (``initdb`` + ``pg_ctl``; as the ``postgres`` user when run as
root, which PostgreSQL refuses to run as) with the databases ``mlflow`` and ``prefect``; ``moto_server`` as the S3
endpoint with the buckets ``adaptbert-mlflow`` (MLflow's artifacts) and ``adaptbert-dvc`` (the DVC remote); ``mlflow
server`` on PostgreSQL with its artifacts in the bucket, proxied (clients need no S3 credentials for MLflow);
``prefect server`` on PostgreSQL; a process worker polling the work pool ``adaptbert`` (prefect.yaml).

The credentials (the database password, the S3 keys) are made up per stack and written only to ``env.sh`` (mode
0600) and handed to the servers through their environment, never on a command line (``ps`` shows those), in
``stack.json`` or on the console. The tests (tests/e2e/test_team_stack.py) start one stack per test run through
:func:`up` and :func:`down`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".team-stack"
USER = "adaptbert"  # the PostgreSQL role owning both databases
DATABASES = ("mlflow", "prefect")
MLFLOW_BUCKET = "adaptbert-mlflow"
DVC_BUCKET = "adaptbert-dvc"
WORK_POOL = "adaptbert"  # prefect.yaml's deployments pull from it
REGION = "us-east-1"
SERVICES = ("moto", "mlflow", "prefect", "worker")  # started in this order, stopped in the reverse
SECRET_KEYS = ("ADAPTBERT_TEAM_PG_PASSWORD", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class StackError(RuntimeError):
    """A part of the stack did not start: the message names it and the tail of its log."""


@dataclass
class Stack:
    """Where the stack's parts listen and their pids (``stack.json``); the secrets live in ``env.sh`` only."""

    folder: Path
    pg_port: int
    s3_port: int
    mlflow_port: int
    prefect_port: int
    pg_dir: str = ""  # the cluster's folder (root: a temp folder the postgres user owns)
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def prefect_api(self) -> str:
        return f"http://127.0.0.1:{self.prefect_port}/api"

    @property
    def dvc_remote(self) -> str:
        return f"s3://{DVC_BUCKET}/store"

    @property
    def env_file(self) -> Path:
        return self.folder / "env.sh"

    def secrets(self) -> dict[str, str]:
        """The stack's credentials (the database password, the S3 keys), read back from ``env.sh``."""
        values = read_env_file(self.env_file)
        return {k: values[k] for k in SECRET_KEYS}

    def client_env(self) -> dict[str, str]:
        """What a pipeline user exports: the servers' URLs and the S3 keys (DVC's remote reads them)."""
        s = self.secrets()
        return {
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "PREFECT_API_URL": self.prefect_api,
            "AWS_ACCESS_KEY_ID": s["AWS_ACCESS_KEY_ID"],
            "AWS_SECRET_ACCESS_KEY": s["AWS_SECRET_ACCESS_KEY"],
            "AWS_DEFAULT_REGION": REGION,
        }

    def database_url(self, database: str, driver: str = "psycopg2") -> str:
        """SQLAlchemy URL of one of the stack's databases (holds the password: never print it)."""
        password = self.secrets()["ADAPTBERT_TEAM_PG_PASSWORD"]
        return f"postgresql+{driver}://{USER}:{password}@127.0.0.1:{self.pg_port}/{database}"

    def save(self) -> None:
        state = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        (self.folder / "stack.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> Stack:
        state = json.loads((folder / "stack.json").read_text(encoding="utf-8"))
        return cls(**{**state, "folder": Path(state["folder"])})


# ----------------------------------------------------------------------------- small helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_env_file(path: Path) -> dict[str, str]:
    """``export K=V`` lines of ``env.sh`` as a dict."""
    pairs = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("export ") and "=" in line:
            key, value = line.removeprefix("export ").split("=", 1)
            pairs[key] = value.strip("'")
    return pairs


def write_private(path: Path, text: str) -> None:
    """``text`` in a file of mode 0600 from its first byte (it holds secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """``env.sh``: ``export K='V'`` lines (the values are URLs and generated keys: no quote in them)."""
    header = "# the team stack's environment (python -m tools.team_stack up): . this file, never commit it\n"
    write_private(path, header + "".join(f"export {k}='{v}'\n" for k, v in values.items()))


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-chars:] if log.exists() else "(no log)"


def wait_for(url: str, proc: subprocess.Popen, name: str, log: Path, seconds: float) -> None:
    """Poll ``url`` until it answers 200, or fail naming ``name`` with its log's tail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StackError(f"{name} exited with {proc.returncode}; its log {log}:\n{tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise StackError(f"{name} did not answer {url} within {seconds:.0f} s; its log {log}:\n{tail(log)}")


def spawn(name: str, argv: list[str], env: dict[str, str], folder: Path, cwd: Path = ROOT) -> subprocess.Popen:
    """A service in its own process group (``down`` stops it with its children), its output in ``logs/<name>.log``."""
    log = folder / "logs" / f"{name}.log"
    with open(log, "a", encoding="utf-8") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)


def base_env() -> dict[str, str]:
    """This environment without the settings the stack sets itself (a user's MLflow or Prefect URL, AWS profile),
    this Python's scripts first on PATH (the worker's flow runs call ``python -m pipeline`` and ``dvc``)."""
    drop = ("MLFLOW_", "PREFECT_", "AWS_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


# ----------------------------------------------------------------------------- PostgreSQL


def postgres_binary(name: str) -> str:
    """``initdb`` / ``pg_ctl`` from PATH, else Debian's /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name) or next(iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))), None)
    if not found:
        raise StackError(f"PostgreSQL's {name} is not installed (Debian: apt-get install postgresql)")
    return str(found)


def as_postgres_user(argv: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: there, its commands run as the ``postgres`` user."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def start_postgres(stack: Stack, password: str) -> None:
    """A private cluster on 127.0.0.1 (password logins only) with the databases of DATABASES."""
    if os.geteuid() == 0:  # the cluster's files belong to the user that runs it, in a folder it can reach
        home = Path(tempfile.mkdtemp(prefix="adaptbert-pg-"))
        shutil.chown(home, "postgres")
    else:
        home = stack.folder / "pg"
        home.mkdir(mode=0o700)
    stack.pg_dir = str(home)
    stack.save()
    data, pwfile, log = home / "data", home / "pw", home / "postgres.log"
    write_private(pwfile, password)
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres")
    init = [postgres_binary("initdb"), "-D", str(data), "-U", USER, "--auth=scram-sha-256"]
    run_checked("postgres initdb", as_postgres_user([*init, f"--pwfile={pwfile}", "-E", "UTF8", "--no-instructions"]))
    pwfile.unlink()
    options = f"-p {stack.pg_port} -k {data} -c listen_addresses=127.0.0.1"
    start = [postgres_binary("pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60", "start"]
    run_checked("postgres", as_postgres_user(start), log)
    conn = connect(stack, "postgres")
    conn.autocommit = True  # CREATE DATABASE runs outside a transaction
    try:
        with conn.cursor() as cur:
            for db in DATABASES:
                cur.execute(f"CREATE DATABASE {db}")  # names from DATABASES above, not input
    finally:
        conn.close()


def connect(stack: Stack, database: str) -> Any:
    """A psycopg2 connection to one of the stack's databases (its password from ``env.sh``)."""
    import psycopg2

    password = stack.secrets()["ADAPTBERT_TEAM_PG_PASSWORD"]
    try:
        return psycopg2.connect(host="127.0.0.1", port=stack.pg_port, user=USER, password=password, dbname=database)
    except psycopg2.Error as err:  # its message names host, port and database, never the password
        raise StackError(f"PostgreSQL on 127.0.0.1:{stack.pg_port}, database {database}: {err}".strip()) from None


def stop_postgres(stack: Stack) -> None:
    """``pg_ctl stop``; the cluster's files go with it (the logs of the services stay)."""
    if not stack.pg_dir:
        return
    home = Path(stack.pg_dir)
    if (home / "data" / "postmaster.pid").exists():
        stop = [postgres_binary("pg_ctl"), "-D", str(home / "data"), "-m", "fast", "-w", "stop"]
        subprocess.run(as_postgres_user(stop), capture_output=True, check=False)
    if (home / "postgres.log").exists():
        shutil.copy(home / "postgres.log", stack.folder / "logs" / "postgres.log")
    shutil.rmtree(home, ignore_errors=True)


def run_checked(name: str, argv: list[str], log: Path | None = None) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StackError(f"{name} failed ({proc.returncode}): {proc.stderr[-1500:]}{tail(log) if log else ''}")


# ----------------------------------------------------------------------------- the services


def start_moto(stack: Stack, env: dict[str, str]) -> subprocess.Popen:
    """moto's S3 server on 127.0.0.1 and the stack's two buckets."""
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    proc = spawn("moto", [moto, "-H", "127.0.0.1", "-p", str(stack.s3_port)], env, stack.folder)
    wait_for(f"{stack.s3_endpoint}/moto-api/", proc, "moto_server (S3)", stack.folder / "logs" / "moto.log", 60)
    s3 = s3_client(stack)
    for bucket in (MLFLOW_BUCKET, DVC_BUCKET):
        s3.create_bucket(Bucket=bucket)
    return proc


def s3_client(stack: Stack) -> Any:  # boto3's client types are generated at run time
    """A boto3 S3 client of the stack's endpoint with its keys."""
    import boto3

    s = stack.secrets()
    return boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        aws_access_key_id=s["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=s["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    )


def start_mlflow(stack: Stack, env: dict[str, str]) -> subprocess.Popen:
    """``mlflow server`` on the ``mlflow`` database, artifacts proxied to the bucket."""
    keys = stack.secrets()
    server_env = {
        **env,
        "AWS_ACCESS_KEY_ID": keys["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": keys["AWS_SECRET_ACCESS_KEY"],
        "AWS_DEFAULT_REGION": REGION,
        # the backend URI holds the password: through the environment (click's envvar), not the command line
        "MLFLOW_BACKEND_STORE_URI": stack.database_url("mlflow"),
        "MLFLOW_S3_ENDPOINT_URL": stack.s3_endpoint,
        # MLflow 3's server also starts GenAI job consumers that import all of MLflow again and poll: not needed
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(stack.mlflow_port)]
    argv += ["--artifacts-destination", f"s3://{MLFLOW_BUCKET}/artifacts", "--serve-artifacts", "--workers", "1"]
    proc = spawn("mlflow", argv, server_env, stack.folder)
    wait_for(f"{stack.mlflow_uri}/health", proc, "mlflow server", stack.folder / "logs" / "mlflow.log", 180)
    return proc


def prefect_env(stack: Stack, env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "PREFECT_HOME": str(stack.folder / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": stack.prefect_api,
    }


def start_prefect(stack: Stack, env: dict[str, str]) -> subprocess.Popen:
    """``prefect server`` on the ``prefect`` database."""
    server_env = {
        **prefect_env(stack, env),
        "PREFECT_API_DATABASE_CONNECTION_URL": stack.database_url("prefect", driver="asyncpg"),
    }
    argv = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
    proc = spawn("prefect", [*argv, "--port", str(stack.prefect_port)], server_env, stack.folder)
    wait_for(f"{stack.prefect_api}/health", proc, "prefect server", stack.folder / "logs" / "prefect.log", 240)
    return proc


def start_worker(stack: Stack, env: dict[str, str]) -> subprocess.Popen:
    """A process worker on the work pool (created if missing); it runs flow runs with the client environment."""
    worker_env = {**prefect_env(stack, env), **stack.client_env(), "PREFECT_WORKER_QUERY_SECONDS": "2"}
    argv = [sys.executable, "-m", "prefect", "worker", "start", "--pool", WORK_POOL, "--type", "process"]
    return spawn("worker", argv, worker_env, stack.folder)


STARTERS = {"moto": start_moto, "mlflow": start_mlflow, "prefect": start_prefect, "worker": start_worker}


# ----------------------------------------------------------------------------- up, down


def up(folder: Path = DEFAULT_DIR, worker: bool = True) -> Stack:
    """Start every part (fails, stopping what it started, if one does not come up); returns the running stack."""
    if (folder / "stack.json").exists():
        raise StackError(f"{folder} holds a stack already: python -m tools.team_stack down first")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "logs").mkdir(exist_ok=True)
    stack = Stack(folder.resolve(), free_port(), free_port(), free_port(), free_port())
    password = secrets.token_urlsafe(18)
    write_env_file(
        stack.env_file,
        {
            "ADAPTBERT_TEAM_PG_PASSWORD": password,
            "AWS_ACCESS_KEY_ID": "AK" + secrets.token_hex(9).upper(),
            "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        },
    )
    stack.save()
    try:
        start_postgres(stack, password)
        env = base_env()
        for name in SERVICES if worker else SERVICES[:-1]:
            stack.pids[name] = STARTERS[name](stack, env).pid
            stack.save()
    except BaseException:
        down(stack)
        raise
    write_env_file(stack.env_file, {**stack.secrets(), **stack.client_env()})
    return stack


def restart(stack: Stack, name: str) -> None:
    """Stop one service and start it again on the same port (what a server restart mid-run looks like)."""
    kill_group(stack.pids.pop(name, 0))
    stack.pids[name] = STARTERS[name](stack, base_env()).pid
    stack.save()


def kill_group(pid: int, seconds: float = 20) -> None:
    """SIGTERM to the process group of ``pid``, then SIGKILL after ``seconds``."""
    if pid <= 0:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):  # our own child: reap it, or it stays a zombie and looks alive
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def down(stack: Stack) -> None:
    """Stop every service by its pid, then PostgreSQL; the folder (logs, data) stays, its ``stack.json`` goes."""
    for name in reversed(SERVICES):
        kill_group(stack.pids.pop(name, 0))
    stop_postgres(stack)
    (stack.folder / "stack.json").unlink(missing_ok=True)


def describe(stack: Stack) -> str:
    """What to run next: the environment file to source and the DVC remote, no secret."""
    return "\n".join(
        [
            f"team stack up in {stack.folder} (logs in {stack.folder / 'logs'}):",
            f"  PostgreSQL   127.0.0.1:{stack.pg_port}  databases {', '.join(DATABASES)} (user {USER})",
            f"  S3 (moto)    {stack.s3_endpoint}  buckets {MLFLOW_BUCKET}, {DVC_BUCKET}",
            f"  MLflow       {stack.mlflow_uri}  (PostgreSQL; artifacts s3://{MLFLOW_BUCKET}/artifacts, proxied)",
            f"  Prefect      {stack.prefect_api}  (PostgreSQL; worker on pool '{WORK_POOL}')",
            "",
            f"  . {stack.env_file}        # the URLs and the S3 keys (mode 0600: never commit or print it)",
            f"  dvc remote add -d team {stack.dvc_remote}",
            f"  dvc remote modify team endpointurl {stack.s3_endpoint}",
            "  dvc repro && dvc push      # docs/team.md",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the stack's state folder (default .team-stack)")
    parser.add_argument("--no-worker", action="store_true", help="no Prefect worker (up)")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            print(describe(up(args.dir, worker=not args.no_worker)))
        elif not (args.dir / "stack.json").exists():
            print(f"no team stack in {args.dir}")
            return 0 if args.command == "down" else 1
        elif args.command == "down":
            down(Stack.load(args.dir))
            print(f"team stack in {args.dir} stopped")
        else:
            print(describe(Stack.load(args.dir)))
    except StackError as err:
        print(f"team stack: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
