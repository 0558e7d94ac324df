// Staging an image that fails part-way (an `npm ci` without the registry, a RUN it cannot reproduce)
// leaves no temporary folder behind: images.test.ts stages three images per run, and a failed
// staging used to keep its half-built `image-*` folder (node_modules included) in the temp directory.
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { stageImage } from './image-staging.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

describe('image staging', () => {
  let probeDir: string;

  beforeAll(() => {
    probeDir = mkdtempSync(join(tmpdir(), 'staging-probe-'));
  });

  afterAll(() => {
    rmSync(probeDir, { recursive: true, force: true });
  });

  it('removes its folder when staging fails after the folder was made', async () => {
    // The gateway's Dockerfile whose deps stage runs a command the staging refuses, after it has
    // created the stage's folder and copied the manifests into it.
    const dockerfile = join(probeDir, 'Dockerfile');
    writeFileSync(
      dockerfile,
      breakText(
        readRepoFile('services/device-gateway/Dockerfile'),
        /RUN npm ci --omit=dev[^\n]*\\\n[^\n]*\n/,
        'RUN make install\n',
      ),
    );
    // stageImage names its folder after the Dockerfile's folder: image-<probe folder>-XXXXXX.
    const leftovers = (): string[] =>
      readdirSync(tmpdir()).filter((name) => name.startsWith(`image-${basename(probeDir)}-`));
    await expect(stageImage(relative(repoRoot, dockerfile))).rejects.toThrow(
      /RUN make install is not reproduced/,
    );
    expect(leftovers()).toEqual([]);
  });
});
