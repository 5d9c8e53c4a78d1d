# `source env.sh` (bash or zsh) after `make demo` or `make deps`: the venv's Open MPI 5 (ULFM) and
# Python first on PATH, so that `mpirun` and `python3` in the README's examples are the ones
# build/ntpbench and analysis/ were installed for, not Debian's /usr/bin/mpirun (which ntpbench
# refuses); and, as root, the two variables Open MPI then asks for.
ntp_venv="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)/.venv"
if [ -x "$ntp_venv/bin/mpirun" ]; then
  export PATH="$ntp_venv/bin:$PATH"
  if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
else
  echo "env.sh: $ntp_venv/bin/mpirun is missing: run \`make deps\` first" >&2
fi
unset ntp_venv
