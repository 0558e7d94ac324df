// The runbook an operator follows from the Kubernetes files: every section a file cites exists; the
// images have build and push commands; whatever the dev overlay points at outside what it deploys is
// named where the runbook says what an overlay expects from the cluster.
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { checkKustomization, dockerfiles, objectValues } from '../src/validate/index.js';
import { readRepoFile, repoRoot } from './helpers.js';

const runbook = readRepoFile('docs/operations.md');
/** Heading texts without their `#`s and section numbers ("7. Scaling" → "Scaling"). */
const headings = [...runbook.matchAll(/^#{2,4} (?:\d+(?:\.\d+)*\.? )?(.+)$/gm)].map((m) => m[1]!.trim());

/** The runbook's section titled `title` (up to the next heading of the same or a higher level). */
function section(title: string): string {
  const start = runbook.search(new RegExp(`^(#{2,4}) (?:\\d+(?:\\.\\d+)*\\.? )?${title}$`, 'm'));
  if (start < 0) throw new Error(`docs/operations.md has no section "${title}"`);
  const level = /^#+/.exec(runbook.slice(start))![0].length;
  const rest = runbook.slice(runbook.indexOf('\n', start) + 1);
  const end = rest.search(new RegExp(`^#{2,${level}} `, 'm'));
  return end < 0 ? rest : rest.slice(0, end);
}

/**
 * The `tool` commands the runbook gives (kubectl, curl): inline code spans that start with the tool's name (a
 * span may wrap onto the next line) and lines of fenced code blocks that do, whitespace made single.
 */
function commandsOf(tool: string, markdown: string): string[] {
  const commands: string[] = [];
  const prose: string[] = [];
  let fenced = false;
  for (const line of markdown.split('\n')) {
    const trimmed = line.trim();
    if (trimmed.startsWith('```')) fenced = !fenced;
    else if (fenced) {
      if (trimmed.startsWith(`${tool} `)) commands.push(trimmed.replace(/\s+#.*$/, ''));
    } else prose.push(line);
  }
  for (const m of prose.join('\n').matchAll(new RegExp(`\`(${tool}\\b[^\`]*)\``, 'g'))) commands.push(m[1]!);
  return commands.map((command) => command.replace(/\s+/g, ' ').trim());
}

/** Text files of the repository (no dependencies, build output or local data). */
function repositoryFiles(dir = repoRoot): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    if (['node_modules', 'dist', '.git', '.data'].includes(entry.name)) return [];
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return repositoryFiles(path);
    return /\.(ts|js|ya?ml|md|json|sh|sql)$|Dockerfile$/.test(entry.name) ? [path] : [];
  });
}

describe('docs/operations.md as the deploy files use it', () => {
  it('has every section that a file cites by its quoted title', () => {
    const cited: string[] = [];
    for (const file of repositoryFiles()) {
      for (const m of readFileSync(file, 'utf8').matchAll(/operations\.md[,]? "([^"]+)"/g)) {
        // A citation may wrap onto the next comment line.
        const title = m[1]!.replace(/\s*\n\s*(?:#|\/\/)?\s*/g, ' ').replace(/^\d+(?:\.\d+)*\.? /, '');
        cited.push(title);
        expect({
          file: relative(repoRoot, file),
          cites: title,
          exists: headings.some((h) => h.startsWith(title)),
        }).toEqual({
          file: relative(repoRoot, file),
          cites: title,
          exists: true,
        });
      }
    }
    expect(cited).toContain('Secrets');
  });

  it('names the namespace in every kubectl command that acts on objects in one', () => {
    // The overlay sets the namespace of what it renders and applies; anything else is run against the
    // namespace of the kubeconfig's context, which is not the platform's (the migration commands said none).
    const commands = commandsOf('kubectl', runbook);
    const withoutNamespace = commands.filter(
      (command) => !/^kubectl (kustomize|apply)\b/.test(command) && !/ (-n|--namespace)[ =]/.test(command),
    );
    expect(withoutNamespace).toEqual([]);
    expect(commands).toContain(
      'kubectl -n "$NS" wait --for=condition=complete job/platform-migrate --timeout=15m',
    );
  });

  it('calls the APIs with curl --fail-with-body, never -f, which hides the problem+json body', () => {
    const commands = commandsOf('curl', runbook);
    expect(commands.length).toBeGreaterThanOrEqual(6);
    const hiding = commands.filter((command) => /\s(-[A-Za-z]*f[A-Za-z]*|--fail)(\s|$)/.test(command));
    expect(hiding).toEqual([]);
    for (const command of commands) expect(command).toContain(' --fail-with-body ');
  });

  it('gives build and push commands for every image', () => {
    const commands = section('Images: build and push');
    for (const path of Object.keys(dockerfiles)) {
      const build = new RegExp(`docker build -f ${path} -t "\\$REGISTRY/([\\w-]+):\\$TAG" \\.`).exec(
        commands,
      );
      expect({ path, build: build !== null }).toEqual({ path, build: true });
      expect(commands).toContain(`docker push "$REGISTRY/${build![1]!}:$TAG"`);
    }
  });

  it('names every address the dev overlay expects outside what it deploys', async () => {
    const { objects } = await checkKustomization(repoRoot, 'dev');
    // Hosts of URLs in the rendered ConfigMaps and Secrets (host, or host:port).
    const hosts = new Set<string>();
    for (const { object } of objects) {
      if (object.kind !== 'ConfigMap' && object.kind !== 'Secret') continue;
      for (const value of Object.values(objectValues(object)))
        for (const m of value.matchAll(/\b[a-z][a-z0-9+]*:\/\/(?:[^@/\s]*@)?([^/\s:]+(?::\d+)?)/g))
          hosts.add(m[1]!);
    }
    // What the overlay itself deploys: its own Services.
    const own = new Set(
      objects
        .filter((o) => o.object.kind === 'Service')
        .map((o) => `${o.object.metadata.name}.platform-dev.svc`),
    );
    const expected = section('What an overlay expects from the cluster');
    const external = [...hosts].filter((host) => !own.has(host.replace(/:\d+$/, '')));
    expect(external.length).toBeGreaterThanOrEqual(3);
    for (const host of external)
      expect({ host, named: expected.includes(host) }).toEqual({ host, named: true });
  });
});
