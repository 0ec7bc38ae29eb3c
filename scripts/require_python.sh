# Sourced (not run) by train_ppo.sh, train_grpo.sh, evaluate.sh and retrieval_launch.sh: stop with one line when
# $PYTHON is missing or cannot import what the calling script needs, which almost always means the
# project's environment is not active; a Python traceback from deep inside a run would not say so.
#   require_python_modules SCRIPT_NAME MODULE...
require_python_modules() {
  local script=$1 fix="activate the project's environment (. .venv/bin/activate; bash scripts/install.sh makes it) or set PYTHON=/path/to/its/python"
  shift
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "$script: no '$PYTHON' on PATH: $fix" >&2
    exit 2
  fi
  local missing
  missing=$("$PYTHON" -c 'import importlib.util, sys; print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))' "$@" 2>/dev/null) || missing="$*"
  if [ -n "$missing" ]; then
    echo "$script: $(command -v "$PYTHON") cannot import ${missing// /, }: $fix" >&2
    exit 2
  fi
}
