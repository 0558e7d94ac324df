// SIGHUP's default action ends the process, and a service takes hundreds of milliseconds to load its modules
// before its own handler (installSecretReload, the gateway's key reload) is installed: a secret rotation that
// signals a replica still starting would kill it (issue 29's cold review, L3). A service's entry point calls
// holdHangups() as its first statement, before it loads anything else (this module imports nothing); the
// signals received until the real handler is installed are counted and handed over by takeHangups().
let held = 0;
const hold = (): void => {
  held++;
};

export function holdHangups(): void {
  process.on('SIGHUP', hold);
}

/** Stops holding; returns how many SIGHUPs arrived meanwhile (the caller reloads once if any). */
export function takeHangups(): number {
  process.off('SIGHUP', hold);
  const count = held;
  held = 0;
  return count;
}
