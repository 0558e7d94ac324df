import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const repoRoot = fileURLToPath(new URL('../../', import.meta.url));

export function readRepoFile(path: string): string {
  return readFileSync(join(repoRoot, path), 'utf8');
}

/** `text` with `from` replaced by `to`; fails the test when `from` is absent (the breakage must apply). */
export function breakText(text: string, from: string | RegExp, to: string): string {
  const broken = text.replace(from, to);
  if (broken === text) throw new Error(`breakage did not apply: ${String(from)} not found`);
  return broken;
}

/** A throwaway copy of the repository's deploy/k8s tree, laid out as in the repository. */
export function copyK8sTree(): {
  root: string;
  edit: (path: string, from: string | RegExp, to: string) => void;
  remove: () => void;
} {
  const root = mkdtempSync(join(tmpdir(), 'deploy-k8s-'));
  cpSync(join(repoRoot, 'deploy/k8s'), join(root, 'deploy/k8s'), { recursive: true });
  return {
    root,
    edit: (path, from, to) => {
      const file = join(root, path);
      writeFileSync(file, breakText(readFileSync(file, 'utf8'), from, to));
    },
    remove: () => rmSync(root, { recursive: true, force: true }),
  };
}
