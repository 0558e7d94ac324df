// A file only this user may read (a password, a key), written so that its mode is always 0600: into a new
// temporary file (O_EXCL: never an existing file or a symlink's target) that then replaces the path by rename
// (which replaces a symlink itself rather than writing through it). writeFileSync's `mode` applies only when it
// creates the file, so an existing 0644 file would have kept its mode (issue 29's cold review, L4).
import { renameSync, rmSync, writeFileSync } from 'node:fs';

export function writePrivateFile(path: string, text: string): void {
  const temporary = `${path}.${process.pid}.tmp`;
  try {
    writeFileSync(temporary, text, { mode: 0o600, flag: 'wx' });
    renameSync(temporary, path);
  } catch (err) {
    rmSync(temporary, { force: true });
    throw err;
  }
}
