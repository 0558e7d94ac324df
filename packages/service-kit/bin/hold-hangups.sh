#!/bin/sh
# hold-hangups.sh COMMAND [ARG...]: runs COMMAND (a Node.js service) as this shell's only child and holds the
# SIGHUPs sent to it until COMMAND handles SIGHUP itself; forwards every other signal at once, and exits as
# COMMAND does.
#
# Why: a service re-reads its secrets on SIGHUP, whose default action ends a process. Its entry point installs a
# handler as its first statement (service-kit's holdHangups), but Node.js runs for about 40-60 ms before any
# JavaScript, and no parent can cover that time from outside: Node resets an inherited "ignore" of SIGHUP to
# the default and replaces the inherited signal mask when it starts (node.cc, ResetSignalHandlers and
# PlatformInit), so a SIGHUP then still ends it (issue 39 §4). This shell catches SIGHUP from its own first
# command on (a few milliseconds after exec) and passes it on only once the child catches SIGHUP, as
# /proc/<pid>/status says (SigCgt: a hex mask of the signals a process catches; SIGHUP, signal 1, is its lowest
# bit). SIGHUPs that arrive before then are one reload, sent as soon as the child can take it.
#
# In an image it sits between the init process and the service: tini -- sh hold-hangups.sh node main.js.
# tini forwards what the container receives to this shell; this shell forwards it to the service.
set -u

child=
held=0

child_catches_hup() {
  mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$child/status" 2>/dev/null) || return 1
  [ -n "$mask" ] || return 1
  case ${mask#"${mask%?}"} in
  [13579bBdDfF]) return 0 ;;
  esac
  return 1
}

on_hup() {
  if [ -n "$child" ] && child_catches_hup; then
    kill -HUP "$child" 2>/dev/null || :
  else
    held=1
  fi
}

forward() {
  if [ -n "$child" ]; then kill -"$1" "$child" 2>/dev/null || :; fi
}

trap on_hup HUP
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward QUIT' QUIT
trap 'forward USR1' USR1
trap 'forward USR2' USR2

if [ "$#" -eq 0 ]; then
  echo 'usage: hold-hangups.sh COMMAND [ARG...]' >&2
  exit 2
fi

"$@" &
child=$!

while :; do
  if [ "$held" -eq 1 ]; then
    if child_catches_hup; then
      held=0
      kill -HUP "$child" 2>/dev/null || :
    elif kill -0 "$child" 2>/dev/null; then
      # Still starting: look again in 10 ms (a trapped signal runs its trap once the sleep ends).
      sleep 0.01
      continue
    else
      held=0
    fi
  fi
  wait "$child"
  status=$?
  # A trapped signal ends `wait` early (status above 128) while the child runs on; a child that has exited but
  # was not reaped yet still answers kill -0, and the next `wait` reaps it. Only a reaped child is gone.
  if kill -0 "$child" 2>/dev/null; then continue; fi
  exit "$status"
done
