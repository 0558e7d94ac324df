// A focused Dockerfile checker (hadolint cannot be installed here): parsed with dockerfile-ast, then the
// image rules of the production shape (design §5) checked on the instructions.
import { DockerfileParser } from 'dockerfile-ast';
import type { Copy, Instruction } from 'dockerfile-ast';
import type { Problem } from './problems.js';

export interface DockerfileExpectations {
  /** Workspace folders whose sources this image may copy from the build context, e.g. ['packages/contracts']. */
  allowedSources: string[];
  /** The `tsc -b <path>` target(s) the build must compile, e.g. ['services/device-gateway']. */
  buildTargets: string[];
  /** False for images without a long-lived endpoint (one-shot jobs): then `HEALTHCHECK NONE` is required. */
  healthcheck: boolean;
  /**
   * A service that re-reads secrets on SIGHUP: its CMD runs it behind service-kit's hold-hangups.sh
   * (`["sh", "packages/service-kit/bin/hold-hangups.sh", "node", …]`), which the final stage copies, so a SIGHUP
   * during Node.js's own start, before any JavaScript can catch it, does not end it (design §4.4).
   */
  holdsHangups?: boolean;
}

/** The CMD prefix of an image whose service holds early SIGHUPs (DockerfileExpectations.holdsHangups). */
export const HOLD_HANGUPS_CMD = ['sh', 'packages/service-kit/bin/hold-hangups.sh', 'node'] as const;

interface Stage {
  name: string | undefined;
  instructions: Instruction[];
}

function stagesOf(instructions: Instruction[]): Stage[] {
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.getKeyword() === 'FROM') {
      const args = ins.getArguments().map((a) => a.getValue());
      const asAt = args.findIndex((a) => a.toUpperCase() === 'AS');
      stages.push({ name: asAt >= 0 ? args[asAt + 1] : undefined, instructions: [] });
    } else stages.at(-1)?.instructions.push(ins);
  }
  return stages;
}

function words(ins: Instruction): string[] {
  return ins.getArguments().map((a) => a.getValue().replace(/^\[?"?|"?,?\]?$/g, ''));
}

const WORKSPACE_ROOTS = ['packages/', 'services/', 'deploy/', 'scripts/'];

export function validateDockerfile(
  text: string,
  expect: DockerfileExpectations,
  file = 'Dockerfile',
): Problem[] {
  const problems: Problem[] = [];
  const add = (message: string): void => {
    problems.push({ file, message });
  };
  const dockerfile = DockerfileParser.parse(text);
  const instructions = dockerfile.getInstructions();
  const stages = stagesOf(instructions);
  if (
    instructions.length === 0 ||
    instructions.find((i) => i.getKeyword() !== 'ARG')?.getKeyword() !== 'FROM'
  )
    add('must start with FROM (after optional ARGs)');
  if (stages.length < 2) add('must be multi-stage (build tools stay out of the runtime image)');
  const final = stages.at(-1);
  if (final === undefined) return problems;

  // Non-root user in the final stage, numeric so Kubernetes runAsNonRoot can verify it.
  const users = final.instructions.filter((i) => i.getKeyword() === 'USER');
  const user = users.at(-1)?.getArgumentsContent()?.trim() ?? '';
  if (user === '') add('the final stage has no USER (it would run as root)');
  else if (/^(root|0)(:|$)/.test(user)) add(`USER ${user} is root`);
  else if (!/^[1-9][0-9]*(:[0-9]+)?$/.test(user))
    add(`USER ${user} should be numeric (uid[:gid]) for runAsNonRoot`);

  const healthchecks = final.instructions.filter((i) => i.getKeyword() === 'HEALTHCHECK');
  const hc = healthchecks.at(-1)?.getArgumentsContent()?.trim() ?? '';
  if (expect.healthcheck && (hc === '' || /^NONE$/i.test(hc))) add('the final stage has no HEALTHCHECK');
  if (!expect.healthcheck && !/^NONE$/i.test(hc)) add('a one-shot image declares HEALTHCHECK NONE');

  // PID 1: tini (or docker-init) forwards signals and reaps zombies; node as PID 1 does neither well.
  const entry = final.instructions.filter((i) => i.getKeyword() === 'ENTRYPOINT').at(-1);
  if (entry === undefined || !words(entry).some((w) => /(^|\/)(tini|docker-init|dumb-init)$/.test(w)))
    add('ENTRYPOINT must run an init (tini) as PID 1');

  if (expect.holdsHangups === true) {
    const cmd = final.instructions.filter((i) => i.getKeyword() === 'CMD').at(-1);
    let argv: unknown;
    try {
      argv = JSON.parse(cmd?.getArgumentsContent() ?? '');
    } catch {
      argv = undefined;
    }
    if (
      !Array.isArray(argv) ||
      argv.length <= HOLD_HANGUPS_CMD.length ||
      HOLD_HANGUPS_CMD.some((word, i) => argv[i] !== word)
    )
      add(
        `CMD must run the service behind hold-hangups.sh: ${JSON.stringify([...HOLD_HANGUPS_CMD, '<main.js>'])}`,
      );
    // A COPY of the final stage must bring the script: its source is the script or a folder holding it
    // (`/src/packages/service-kit/bin`), named from `packages/` on.
    const script = HOLD_HANGUPS_CMD[1];
    const sources = final.instructions
      .filter((i) => i.getKeyword() === 'COPY')
      .flatMap((i) => words(i).slice(0, -1))
      .map((src) => src.replace(/\/$/, ''))
      .filter((src) => src.includes('packages/'))
      .map((src) => src.slice(src.indexOf('packages/')));
    if (!sources.some((src) => script === src || script.startsWith(`${src}/`)))
      add(`the final stage does not copy ${script}`);
  }

  // Production dependencies only: the runtime's node_modules come from an `npm ci --omit=dev` stage.
  const run = (s: Stage): string =>
    s.instructions
      .filter((i) => i.getKeyword() === 'RUN')
      .map((i) => i.getArgumentsContent() ?? '')
      .join('\n');
  const prodStages = new Set(
    stages.filter((s) => /npm (ci|prune)[^\n]*--omit=dev/.test(run(s))).map((s) => s.name),
  );
  const finalCopies = final.instructions.filter((i): i is Copy => i.getKeyword() === 'COPY');
  const nodeModulesCopy = finalCopies.find((c) => words(c).some((w) => w.includes('node_modules')));
  if (nodeModulesCopy === undefined && !/npm ci[^\n]*--omit=dev/.test(run(final)))
    add('the runtime stage gets no production node_modules (npm ci --omit=dev)');
  if (nodeModulesCopy !== undefined) {
    const from =
      nodeModulesCopy
        .getFlags()
        .find((f) => f.getName() === 'from')
        ?.getValue() ?? undefined;
    if (!prodStages.has(from ?? ''))
      add(`node_modules are copied from stage "${from ?? '?'}", which does not install with --omit=dev`);
  }

  // Build only this service and what it imports.
  const allRuns = stages.map(run).join('\n');
  for (const target of expect.buildTargets)
    if (!new RegExp(`tsc -b[^\\n]*\\b${target.replace(/[/.]/g, '\\$&')}\\b`).test(allRuns))
      add(`no "tsc -b ${target}" build step`);
  for (const ins of instructions) {
    if (ins.getKeyword() !== 'COPY' && ins.getKeyword() !== 'ADD') continue;
    const copy = ins as Copy;
    if (copy.getFlags().some((f) => f.getName() === 'from')) continue;
    const args = words(copy);
    for (const src of args.slice(0, -1)) {
      const path = src.replace(/^\.\//, '');
      if (!WORKSPACE_ROOTS.some((r) => path.startsWith(r))) {
        if (path === '.' || path === '*' || path === '') add(`COPY ${src} copies the whole build context`);
        continue;
      }
      if (/(^|\/)package\.json$/.test(path)) continue;
      if (
        !expect.allowedSources.some(
          (allowed) => path === allowed || path.startsWith(`${allowed.replace(/\/$/, '')}/`),
        )
      )
        add(`COPY ${src}: not a workspace this image needs (${expect.allowedSources.join(', ')})`);
    }
  }
  return problems;
}
