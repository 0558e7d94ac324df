import { checkDockerfiles, dockerfiles, validateDockerfile } from '../src/validate/index.js';
import { breakText, readRepoFile, repoRoot } from './helpers.js';

const gatewayPath = 'services/device-gateway/Dockerfile';
const gateway = readRepoFile(gatewayPath);
const messages = (text: string): string[] =>
  validateDockerfile(text, dockerfiles[gatewayPath]!).map((p) => p.message);

describe('Dockerfiles', () => {
  it('both services and the ops image pass the structural checks', () => {
    expect(checkDockerfiles(repoRoot)).toEqual([]);
  });

  it.each([
    ['no USER (root)', /\nUSER 1000:1000\n/, '\n', /no USER/],
    ['USER root', /\nUSER 1000:1000\n/, '\nUSER root\n', /USER root is root/],
    ['a single stage', /[\s\S]*FROM \$\{NODE_IMAGE\} AS runtime/, 'FROM node:24', /must be multi-stage/],
    ['no HEALTHCHECK', /HEALTHCHECK [\s\S]*?\n(?=ENTRYPOINT)/, '', /no HEALTHCHECK/],
    ['no init as PID 1', 'ENTRYPOINT ["/usr/bin/tini", "--"]\n', '', /ENTRYPOINT must run an init/],
    [
      'dev dependencies in the runtime',
      'COPY --from=deps /app/node_modules',
      'COPY --from=build /src/node_modules',
      /does not install with --omit=dev/,
    ],
    [
      'a workspace the gateway does not need',
      'COPY services/device-gateway/ services/device-gateway/',
      'COPY services/device-gateway/ services/device-gateway/\nCOPY packages/testkit/ packages/testkit/',
      /COPY packages\/testkit\/: not a workspace this image needs/,
    ],
    [
      'the whole build context',
      'COPY services/device-gateway/ services/device-gateway/',
      'COPY . .',
      /copies the whole build context/,
    ],
    [
      'another service built',
      'RUN npx tsc -b services/device-gateway',
      'RUN npx tsc -b',
      /no "tsc -b services\/device-gateway" build step/,
    ],
    [
      'node run directly, where a SIGHUP during its start ends it',
      'CMD ["sh", "packages/service-kit/bin/hold-hangups.sh", "node", "services/device-gateway/dist/main.js"]',
      'CMD ["node", "services/device-gateway/dist/main.js"]',
      /CMD must run the service behind hold-hangups\.sh/,
    ],
    [
      'the wrapper without a command',
      'CMD ["sh", "packages/service-kit/bin/hold-hangups.sh", "node", "services/device-gateway/dist/main.js"]',
      'CMD ["sh", "packages/service-kit/bin/hold-hangups.sh", "node"]',
      /CMD must run the service behind hold-hangups\.sh/,
    ],
    [
      'the wrapper not copied into the image',
      'COPY --from=build /src/packages/service-kit/bin packages/service-kit/bin\n',
      '',
      /the final stage does not copy packages\/service-kit\/bin\/hold-hangups\.sh/,
    ],
  ])('fails on a broken copy: %s', (_name, from, to, expected) => {
    expect(messages(breakText(gateway, from, to)).join('\n')).toMatch(expected);
  });
});
