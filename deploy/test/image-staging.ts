// Stages a Dockerfile's runtime image on this machine without a Docker engine: the files its
// final stage copies, derived from the Dockerfile itself (never from a second list), with the stage's
// ENV, WORKDIR, USER, ENTRYPOINT and CMD. How each stage is reproduced:
// - the build stage (the one that runs `tsc -b`) is this checkout: files it COPYs from the build context
//   are read from the repository (minus .dockerignore), and the `dist` folders of the workspaces its
//   `tsc -b <targets>` compiles (targets and their project references) are this checkout's build output,
//   which `npm test` produces first;
// - any other intermediate stage (deps) is materialised in a folder: its COPYs are replayed and its
//   `npm ci` is run there with the same arguments (plus --prefer-offline, so npm's cache serves what it has);
// - the final stage gets exactly the files its COPY instructions name.
// Anything this cannot reproduce faithfully (another RUN, an ADD, a stage built FROM another stage, an
// ENTRYPOINT other than tini) fails with a message instead of being approximated.
import { spawn } from 'node:child_process';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, dirname, join, posix } from 'node:path';
import { DockerfileParser } from 'dockerfile-ast';
import type { Copy, Env, Instruction } from 'dockerfile-ast';
import { repoRoot } from './helpers.js';

interface Stage {
  name: string;
  base: string;
  instructions: Instruction[];
}

export interface StagedImage {
  /** The Dockerfile, relative to the repository root. */
  dockerfile: string;
  /** The base image of the final stage, ARG defaults substituted (e.g. `node:24.19.0-bookworm-slim`). */
  baseImage: string;
  /** Host folder standing for the final stage's filesystem root below WORKDIR. */
  dir: string;
  /** The image's environment (ENV of the final stage, in order). */
  env: Record<string, string>;
  /** CMD after the init process (tini) of ENTRYPOINT; `node` stays `node` (the caller picks the binary). */
  command: string[];
  /** USER of the final stage when numeric (`1000:1000`). */
  user: { uid: number; gid: number } | undefined;
  /** Relative paths of everything the final stage copied, for assertions and messages. */
  copied: string[];
  remove(): void;
}

// ---- Dockerfile parsing -------------------------------------------------------------------------

function argDefaults(instructions: Instruction[]): Map<string, string> {
  const args = new Map<string, string>();
  for (const ins of instructions) {
    if (ins.getKeyword() !== 'ARG') continue;
    const [name, value] = (ins.getArgumentsContent() ?? '').split('=', 2);
    if (name !== undefined && value !== undefined) args.set(name.trim(), value.trim());
  }
  return args;
}

function substitute(text: string, args: Map<string, string>): string {
  return text.replace(
    /\$\{(\w+)\}|\$(\w+)/g,
    (whole, braced: string | undefined, bare: string | undefined) => {
      const value = args.get(braced ?? bare ?? '');
      if (value === undefined) throw new Error(`${whole} has no default in the Dockerfile`);
      return value;
    },
  );
}

function stagesOf(text: string): Stage[] {
  const instructions = DockerfileParser.parse(text).getInstructions();
  const args = argDefaults(
    instructions.slice(
      0,
      instructions.findIndex((i) => i.getKeyword() === 'FROM'),
    ),
  );
  const stages: Stage[] = [];
  for (const ins of instructions) {
    if (ins.getKeyword() === 'FROM') {
      const words = ins.getArguments().map((a) => a.getValue());
      const as = words.findIndex((w) => w.toUpperCase() === 'AS');
      stages.push({
        name: as >= 0 ? (words[as + 1] ?? '') : String(stages.length),
        base: substitute(words[0] ?? '', args),
        instructions: [],
      });
    } else stages.at(-1)?.instructions.push(ins);
  }
  for (const stage of stages) {
    if (stages.some((s) => s.name === stage.base)) {
      throw new Error(`stage ${stage.name} is built FROM stage ${stage.base}: not reproduced by this test`);
    }
  }
  return stages;
}

function jsonForm(ins: Instruction): string[] {
  const content = ins.getArgumentsContent() ?? '';
  const parsed: unknown = JSON.parse(content);
  if (!Array.isArray(parsed) || !parsed.every((w) => typeof w === 'string')) {
    throw new Error(`${ins.getKeyword()} ${content}: only the JSON (exec) form is reproduced`);
  }
  return parsed;
}

function workdirOf(stage: Stage): string {
  const dirs = stage.instructions.filter((i) => i.getKeyword() === 'WORKDIR');
  if (dirs.length !== 1) throw new Error(`stage ${stage.name}: expected exactly one WORKDIR`);
  const dir = dirs[0]!.getArgumentsContent() ?? '';
  if (!dir.startsWith('/')) throw new Error(`stage ${stage.name}: WORKDIR ${dir} is not absolute`);
  return posix.normalize(dir);
}

interface CopyStep {
  from: string | undefined;
  sources: string[];
  dest: string;
}

function copySteps(stage: Stage): CopyStep[] {
  return stage.instructions
    .filter((i) => i.getKeyword() === 'COPY' || i.getKeyword() === 'ADD')
    .map((ins) => {
      if (ins.getKeyword() === 'ADD') throw new Error(`stage ${stage.name}: ADD is not reproduced`);
      const copy = ins as Copy;
      const flags = copy.getFlags();
      const unknown = flags.filter((f) => !['from', 'chown', 'chmod', 'link'].includes(f.getName()));
      if (unknown.length > 0) throw new Error(`COPY --${unknown[0]!.getName()} is not reproduced`);
      const words = copy.getArguments().map((a) => a.getValue());
      return {
        from: flags.find((f) => f.getName() === 'from')?.getValue() ?? undefined,
        sources: words.slice(0, -1),
        dest: words.at(-1) ?? '',
      };
    });
}

function runCommands(stage: Stage): string[] {
  return stage.instructions
    .filter((i) => i.getKeyword() === 'RUN')
    .flatMap((i) => (i.getArgumentsContent() ?? '').split('&&'))
    .map((c) => c.trim().replace(/\s+/g, ' '));
}

// ---- the build context and the build stage ------------------------------------------------------

/** .dockerignore as an ordered list of (regex, negated); the last matching pattern decides. */
function dockerignore(): Array<{ re: RegExp; negated: boolean }> {
  const path = join(repoRoot, '.dockerignore');
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'))
    .map((line) => {
      const negated = line.startsWith('!');
      const pattern = (negated ? line.slice(1) : line).replace(/^\/|\/$/g, '');
      const re = pattern
        .split('/')
        .map((part) =>
          part === '**'
            ? '(?:.*)'
            : part
                .replace(/[.+^${}()|[\]\\]/g, '\\$&')
                .replace(/\*/g, '[^/]*')
                .replace(/\?/g, '[^/]'),
        )
        .join('/')
        .replace(/\(\?:\.\*\)\//g, '(?:.*/)?');
      return { re: new RegExp(`^${re}$`), negated };
    });
}

const ignorePatterns = dockerignore();

/** Whether `path` (relative to the repository root) is outside the build context. */
function ignored(path: string): boolean {
  const parts = path.split('/');
  for (let i = 1; i <= parts.length; i++) {
    const prefix = parts.slice(0, i).join('/');
    let excluded = false;
    for (const { re, negated } of ignorePatterns) if (re.test(prefix)) excluded = !negated;
    if (excluded) return true;
  }
  return false;
}

/** Project references of `dir`'s tsconfig.json, recursively: what `tsc -b dir` compiles. */
function buildClosure(dir: string, seen = new Set<string>()): Set<string> {
  const normal = posix.normalize(dir).replace(/\/$/, '');
  if (seen.has(normal)) return seen;
  seen.add(normal);
  const config = JSON.parse(readFileSync(join(repoRoot, normal, 'tsconfig.json'), 'utf8')) as {
    references?: Array<{ path: string }>;
  };
  for (const ref of config.references ?? []) buildClosure(posix.join(normal, ref.path), seen);
  return seen;
}

/**
 * What a path of the build stage's filesystem is on this machine: a file or folder of the checkout.
 * Sources come from the build context (COPYs without --from), `<workspace>/dist` from `tsc -b`.
 */
function buildStageResolver(stage: Stage): (containerPath: string) => string {
  const workdir = workdirOf(stage);
  const contextCopies = copySteps(stage).filter((c) => c.from === undefined);
  const compiled = new Set<string>();
  for (const command of runCommands(stage)) {
    const match = /^(?:npx )?tsc -b (.+)$/.exec(command);
    if (match) for (const target of match[1]!.split(' ')) buildClosure(target, compiled);
  }
  /** The context path a build-stage path was copied from, if a COPY put it there. */
  const fromContext = (relative: string): string | undefined => {
    for (const copy of contextCopies) {
      const dest = posix.normalize(copy.dest).replace(/^\.\/?/, '');
      for (const source of copy.sources) {
        const src = posix.normalize(source).replace(/\/$/, '');
        const intoDir = copy.dest.endsWith('/') || copy.sources.length > 1;
        const srcIsDir = statSync(join(repoRoot, src)).isDirectory();
        // A folder's contents land in dest; a file lands in dest/ (a folder) or at dest.
        const landed = srcIsDir ? dest.replace(/\/$/, '') : intoDir ? posix.join(dest, basename(src)) : dest;
        if (relative === landed) return src;
        if (srcIsDir && relative.startsWith(`${landed}/`))
          return posix.join(src, relative.slice(landed.length + 1));
      }
    }
    return undefined;
  };
  return (containerPath) => {
    const normal = posix.normalize(containerPath).replace(/\/$/, '');
    if (!normal.startsWith(`${workdir}/`))
      throw new Error(`${containerPath} is outside the build stage's ${workdir}`);
    const relative = normal.slice(workdir.length + 1);
    const dist = /^(.+?)\/dist(?:\/.*)?$/.exec(relative);
    if (dist && compiled.has(dist[1]!)) {
      // tsc can only have compiled a workspace whose sources the stage copied.
      if (fromContext(`${dist[1]!}/tsconfig.json`) === undefined) {
        throw new Error(`${containerPath}: the build stage compiles ${dist[1]!} without copying its sources`);
      }
      return join(repoRoot, relative);
    }
    const source = fromContext(relative);
    if (source === undefined || ignored(source)) {
      throw new Error(
        `${containerPath} does not exist in the build stage (neither copied nor compiled there)`,
      );
    }
    return join(repoRoot, source);
  };
}

// ---- materialising stages -----------------------------------------------------------------------

/** Docker's COPY: a folder's contents go into dest, a file into dest/ or to dest; symlinks stay links. */
function replayCopy(sources: string[], dest: string, hostDest: string, copied: string[]): void {
  const intoDir = dest.endsWith('/') || sources.length > 1;
  for (const source of sources) {
    if (!existsSync(source)) throw new Error(`COPY source ${source} does not exist`);
    const target = statSync(source).isDirectory() || !intoDir ? hostDest : join(hostDest, basename(source));
    mkdirSync(dirname(target), { recursive: true });
    cpSync(source, target, { recursive: true, verbatimSymlinks: true });
    copied.push(target);
  }
}

function npmEnv(): NodeJS.ProcessEnv {
  // The staging npm must not inherit `npm test`'s npm_* settings (prefix, lifecycle, package fields).
  const env: NodeJS.ProcessEnv = {};
  for (const [key, value] of Object.entries(process.env)) if (!/^npm_/i.test(key)) env[key] = value;
  return env;
}

function run(command: string, args: string[], cwd: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let output = '';
    const child = spawn(command, args, { cwd, env: npmEnv(), stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout.on('data', (c: Buffer) => (output += c.toString()));
    child.stderr.on('data', (c: Buffer) => (output += c.toString()));
    child.once('error', reject);
    child.once('exit', (code) =>
      code === 0
        ? resolve()
        : reject(
            new Error(
              `${command} ${args.join(' ')} in ${cwd} exited ${String(code)}:\n${output.slice(-3000)}`,
            ),
          ),
    );
  });
}

/** Replays an intermediate stage's RUN: `npm ci` as written (plus --prefer-offline); `npm cache clean` is
 * skipped (it would empty this machine's shared cache and changes nothing the image copies). */
async function replayRuns(stage: Stage, cwd: string): Promise<void> {
  for (const command of runCommands(stage)) {
    if (command === 'npm cache clean --force') continue;
    const words = command.split(' ');
    if (words[0] !== 'npm' || words[1] !== 'ci') {
      throw new Error(`stage ${stage.name}: RUN ${command} is not reproduced by this test`);
    }
    await run('npm', [...words.slice(1), '--prefer-offline'], cwd);
  }
}

/** System setup of the final stage (apt packages such as tini) has no equivalent here; anything else fails. */
function checkFinalRuns(stage: Stage): void {
  for (const command of runCommands(stage)) {
    if (/^apt-get (update|install) /.test(`${command} `) || command === 'rm -rf /var/lib/apt/lists/*')
      continue;
    throw new Error(`final stage: RUN ${command} is not reproduced by this test`);
  }
}

/**
 * Stages `dockerfile` (relative to the repository root) in a new temporary folder. The caller removes it
 * with `remove()`; when staging fails (an `npm ci` that cannot reach the registry, an instruction this
 * cannot reproduce), the folder is removed before the error is passed on.
 */
export async function stageImage(dockerfile: string): Promise<StagedImage> {
  const stages = stagesOf(readFileSync(join(repoRoot, dockerfile), 'utf8'));
  const final = stages.at(-1);
  if (final === undefined) throw new Error(`${dockerfile} has no stage`);
  const root = mkdtempSync(join(tmpdir(), `image-${basename(dirname(join(repoRoot, dockerfile)))}-`));
  try {
    return await stageInto(root, dockerfile, stages, final);
  } catch (err) {
    rmSync(root, { recursive: true, force: true });
    throw err;
  }
}

async function stageInto(
  root: string,
  dockerfile: string,
  stages: Stage[],
  final: Stage,
): Promise<StagedImage> {
  // The image's user (uid 1000) must be able to enter the staged root.
  chmodSync(root, 0o755);
  const resolvers = new Map<string, (containerPath: string) => string>();

  for (const stage of stages.slice(0, -1)) {
    if (runCommands(stage).some((c) => /^(npx )?tsc -b /.test(c))) {
      resolvers.set(stage.name, buildStageResolver(stage));
      continue;
    }
    const workdir = workdirOf(stage);
    const dir = join(root, `stage-${stage.name}`);
    mkdirSync(dir, { recursive: true });
    for (const copy of copySteps(stage)) {
      const resolve = copy.from === undefined ? undefined : resolvers.get(copy.from);
      if (resolve === undefined) throw new Error(`stage ${stage.name}: COPY without a reproducible --from`);
      replayCopy(copy.sources.map(resolve), copy.dest, join(dir, copy.dest), []);
    }
    await replayRuns(stage, dir);
    resolvers.set(stage.name, (containerPath) => {
      const normal = posix.normalize(containerPath);
      if (normal !== workdir && !normal.startsWith(`${workdir}/`)) {
        throw new Error(`${containerPath} is outside stage ${stage.name}'s ${workdir}`);
      }
      return join(dir, normal.slice(workdir.length));
    });
  }

  checkFinalRuns(final);
  const workdir = workdirOf(final);
  const dir = join(root, 'image');
  mkdirSync(dir, { recursive: true });
  const copied: string[] = [];
  for (const copy of copySteps(final)) {
    const resolve = copy.from === undefined ? undefined : resolvers.get(copy.from);
    if (resolve === undefined) {
      throw new Error(`final stage: COPY ${copy.sources.join(' ')} is not from a reproducible stage`);
    }
    const dest = copy.dest.startsWith('/') ? posix.relative(workdir, copy.dest) : copy.dest;
    if (dest.startsWith('..')) throw new Error(`final stage: COPY to ${copy.dest} lands outside ${workdir}`);
    replayCopy(copy.sources.map(resolve), copy.dest, join(dir, dest), copied);
  }

  const env: Record<string, string> = {};
  let entrypoint: string[] = [];
  let command: string[] = [];
  let user: StagedImage['user'];
  for (const ins of final.instructions) {
    const keyword = ins.getKeyword();
    if (keyword === 'ENV')
      for (const p of (ins as Env).getProperties()) env[p.getName()] = p.getValue() ?? '';
    if (keyword === 'ENTRYPOINT') entrypoint = jsonForm(ins);
    if (keyword === 'CMD') command = jsonForm(ins);
    if (keyword === 'USER') {
      const match = /^(\d+)(?::(\d+))?$/.exec(ins.getArgumentsContent() ?? '');
      user = match ? { uid: Number(match[1]), gid: Number(match[2] ?? match[1]) } : undefined;
    }
  }
  // tini (`tini --`) only execs CMD as its child and forwards signals; it is not installed here.
  if (
    entrypoint.length > 0 &&
    !(entrypoint.length === 2 && /\/tini$/.test(entrypoint[0]!) && entrypoint[1] === '--')
  ) {
    throw new Error(`ENTRYPOINT ${JSON.stringify(entrypoint)} is not reproduced by this test`);
  }
  if (command.length === 0) throw new Error(`${dockerfile} has no CMD`);
  return {
    dockerfile,
    baseImage: final.base,
    dir,
    env,
    command,
    user,
    copied: copied.map((p) => p.slice(dir.length + 1)),
    remove: () => rmSync(root, { recursive: true, force: true }),
  };
}
