#!/usr/bin/env bash
# Install the programs some tests run that pip cannot bring: Open MPI's mpirun (Debian's openmpi-bin),
# Slurm's scontrol (slurm-client, whose host-list expansion the tests compare with xlarun's), zsh and
# tcsh (the shells whose completion scripts the tests load), and OpenSSH's sshd, ssh and ssh-keygen with
# iproute2's ss (the private ssh server that the multi-host tests reach, and the connection resets they cause).
# Needs root and apt-get; installs only what is missing.
set -euo pipefail
say() { echo "install-test-programs: $*" >&2; }
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v scontrol >/dev/null || missing+=(slurm-client)
command -v zsh >/dev/null || missing+=(zsh)
command -v tcsh >/dev/null || missing+=(tcsh)
# sshd lives in /usr/sbin, which a non-login root shell may leave off PATH.
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
{ command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; } || missing+=(openssh-client)
command -v ss >/dev/null || missing+=(iproute2)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    say "cannot install ${missing[*]} (needs root and apt-get): the tests that run them will skip"
    exit 3
fi
log=$(mktemp)
install() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }
# Stale package lists are refreshed once, only when the install cannot find a package.
if ! install && ! { apt-get update >>"$log" 2>&1 && install; }; then
    say "apt-get could not install ${missing[*]}: $(tail -n 1 "$log")"
    rm -f "$log"
    exit 3
fi
rm -f "$log"
