// docs/benchmarks.md and the README against package.json: the document opens with one table of every
// benchmark's current figures, each dated and with the command that measures it, and the dated passes come
// after it (it read as a diary, newest pass first and no summary); the number of benchmarks it states, every
// `bench:*` script in both command tables, and no section presenting as the latest figures that was measured on
// another Node.js release than the one the project runs on (the root devDependency `node`).
import { readFileSync } from 'node:fs';

const read = (path: string): string => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');
const manifest = JSON.parse(read('package.json')) as {
  scripts: Record<string, string>;
  devDependencies: Record<string, string>;
};
const benchmarks = read('docs/benchmarks.md');
const readme = read('README.md');
const scripts = Object.keys(manifest.scripts).filter((name) => name.startsWith('bench:'));
const numbers = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine', 'ten'];

describe('docs/benchmarks.md', () => {
  it('opens with one table of the current figures, each dated and with its command, before any pass', () => {
    const headings = [...benchmarks.matchAll(/^(#{2,}) (.*)$/gm)].map((m) => ({
      level: m[1]!.length,
      title: m[2]!,
      at: m.index,
    }));
    expect(headings[0]?.title).toBe('Current figures');
    const start = headings[0]!.at;
    const rows = benchmarks
      .slice(start, headings[1]?.at)
      .split('\n')
      .filter((line) => line.startsWith('| ') && !line.startsWith('| figure |'));
    expect(rows.length).toBeGreaterThanOrEqual(scripts.length);
    const measured = new Set<string>();
    for (const row of rows) {
      const cells = row.split(' | ');
      const command = /`[^`]*npm run (bench:[\w-]+)[^`]*`/.exec(cells.at(-1) ?? '')?.[1];
      expect({ row, dated: /\b20\d\d-\d\d-\d\d\b/.test(cells.at(-2) ?? ''), command }).toEqual({
        row,
        dated: true,
        command: expect.stringMatching(/^bench:/) as unknown,
      });
      measured.add(command!);
    }
    expect([...measured].filter((script) => !scripts.includes(script))).toEqual([]);
    expect(scripts.filter((script) => !measured.has(script))).toEqual([]);
    // Every dated pass is a section under "The passes", after the table.
    const passes = headings.find((h) => h.level === 2 && h.title === 'The passes');
    expect(passes).toBeDefined();
    for (const h of headings.filter((h) => /\b20\d\d-\d\d-\d\d\b/.test(h.title)))
      expect({ title: h.title, level: h.level, underPasses: h.at > passes!.at }).toEqual({
        title: h.title,
        level: 3,
        underPasses: true,
      });
  });

  it('states how many benchmarks there are', () => {
    expect(scripts.length).toBeGreaterThan(0);
    expect(benchmarks).toContain(`The ${numbers[scripts.length]!} benchmarks print figures`);
  });

  it('lists every bench script in its table and in the README', () => {
    const readmeRow = readme.split('\n').find((line) => line.startsWith('| `npm run bench:')) ?? '';
    for (const script of scripts) {
      expect({ script, inBenchmarks: benchmarks.includes(`| \`npm run ${script}\``) }).toEqual({
        script,
        inBenchmarks: true,
      });
      expect({ script, inReadme: readmeRow.includes(`${script}\``) }).toEqual({ script, inReadme: true });
    }
  });

  it('calls figures the latest only when they were measured on the Node.js release the project runs on', () => {
    const latest = benchmarks
      .split('\n')
      .filter((line) => /^#+ .*\blatest\b/i.test(line) && !line.startsWith('# '));
    for (const heading of latest) expect(heading).toContain(`Node ${manifest.devDependencies.node}`);
  });
});
