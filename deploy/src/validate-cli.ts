// `npm run validate -w @platform/deploy`: the offline checks of compose, Kubernetes, the realm, the
// Dockerfiles and the monitoring files (the PostgREST-against-database check needs a database and runs in the tests).
import { fileURLToPath } from 'node:url';
import {
  checkComposeFile,
  checkDockerfiles,
  checkKustomization,
  checkMonitoringFiles,
  checkRealmFile,
  formatProblems,
  KUBERNETES_SCHEMA_VERSION,
} from './validate/index.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const problems = [
  ...checkComposeFile(root),
  ...checkRealmFile(root),
  ...checkDockerfiles(root),
  ...(await checkKustomization(root, 'base')).problems,
  ...(await checkKustomization(root, 'dev')).problems,
  ...(await checkKustomization(root, 'production')).problems,
  ...checkMonitoringFiles(root),
];
if (problems.length > 0) {
  process.stderr.write(`${formatProblems(problems)}\n${problems.length} problem(s)\n`);
  process.exitCode = 1;
} else {
  process.stdout.write(`deploy files valid (Kubernetes schemas ${KUBERNETES_SCHEMA_VERSION})\n`);
}
