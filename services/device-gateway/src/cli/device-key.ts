// Entry point of `npm run device-key -- …` (see device-key-command.ts). The one place it reads process.env.
import { runDeviceKey } from './device-key-command.js';

process.exitCode = await runDeviceKey(process.argv.slice(2), process.env, {
  out: (text) => process.stdout.write(`${text}\n`),
  err: (text) => process.stderr.write(`${text}\n`),
});
