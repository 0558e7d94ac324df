// Secrets re-read on a signal (SIGHUP) without a restart: the gateway's API keys, the workflow's webhook
// tokens. Rotation mounts a new file and signals the process; its previous secrets stay valid until the
// new ones have been read and checked.
import type { Logger } from 'winston';
import { errorMessage } from './errors.js';
import { takeHangups } from './hangup.js';
import type { SecretSet } from './secrets.js';

export interface SecretReloadOptions {
  logger: Logger;
  /** What the secrets are, plural, as the log lines name them, e.g. `webhook tokens`. */
  what: string;
  /**
   * Reads and checks the secrets again (file and variable, as at start). Throws when they cannot be used
   * (the file is gone, holds none, holds one no Authorization header can carry): the current ones stay.
   * Its error message is logged, so it must not contain a secret.
   */
  read: () => SecretSet;
  /** Takes the new set into use (the next request sees it). */
  apply: (secrets: SecretSet) => void;
  /** Default SIGHUP. */
  signal?: NodeJS.Signals;
}

export interface SecretReloadHandle {
  /** Reloads now, as the signal does; true when the new set was applied. */
  reload: () => boolean;
  /** Removes the signal listener. */
  dispose: () => void;
}

/**
 * Re-reads secrets on `signal` (SIGHUP), whose default action ends the process: install it before anything is
 * bound, so a rotation that signals a process still starting does not kill it. A reload that fails is logged
 * and changes nothing; neither path logs a secret, only the count and fingerprints.
 */
export function installSecretReload(options: SecretReloadOptions): SecretReloadHandle {
  const signal = options.signal ?? 'SIGHUP';
  const reload = (): boolean => {
    let secrets: SecretSet;
    try {
      secrets = options.read();
    } catch (err) {
      options.logger.error(`${options.what} reload failed; the previous ${options.what} stay valid`, {
        signal,
        error: errorMessage(err),
      });
      return false;
    }
    options.apply(secrets);
    options.logger.info(`${options.what} reloaded`, {
      signal,
      count: secrets.size,
      fingerprints: secrets.fingerprints(),
    });
    return true;
  };
  const onSignal = (): void => {
    reload();
  };
  process.on(signal, onSignal);
  // SIGHUPs that came while the process was still loading (see hangup.ts): one reload covers them.
  if (signal === 'SIGHUP' && takeHangups() > 0) reload();
  return { reload, dispose: () => process.off(signal, onSignal) };
}
