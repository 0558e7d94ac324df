// Entry point of `npm run device-key -- …` (see device-key-command.ts); its configuration comes from config.ts.
import { deviceKeyConfig } from '../config.js';
import { runDeviceKey } from './device-key-command.js';

process.exitCode = await runDeviceKey(process.argv.slice(2), deviceKeyConfig(), {
  out: (text) => process.stdout.write(`${text}\n`),
  err: (text) => process.stderr.write(`${text}\n`),
});
