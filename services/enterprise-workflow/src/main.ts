// The process's entry point. Its first statement holds SIGHUPs (a secret rotation may signal a replica still
// starting, and SIGHUP's default action ends the process); only then is the service loaded (run.ts), which
// takes the held signals over when it installs its reload handler.
import { holdHangups } from '@platform/service-kit/hangup';

holdHangups();
await import('./run.js');
