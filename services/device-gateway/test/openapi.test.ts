import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createDb, createLogger, SecretSet } from '@platform/service-kit';
import { freePort, renderOpenApiYaml } from '@platform/testkit';
import { Ajv2020 } from 'ajv/dist/2020.js';
import request from 'supertest';
import { parse } from 'yaml';
import { buildApp, type GatewayApp } from '../src/app.js';
import { loadGatewayConfig } from '../src/config.js';
import { loadRegistry } from '../src/db/registry-repository.js';
import type { GatewayDatabase } from '../src/db/tables.js';
import { gatewayApiDocument } from '../src/http/api-document.js';
import { gatewayRoutes } from '../src/http/routes.js';
import { overrideRoutes } from '../src/http/override-routes.js';
import { apiKeyStep } from '../src/http/route-parts.js';
import { API_KEYS, startGateway, type GatewayFixture } from './support/gateway.js';

interface ResponseObject {
  $ref?: string;
  headers?: Record<string, { required?: boolean }>;
  content?: Record<string, { schema: unknown }>;
}
interface Operation {
  responses: Record<string, ResponseObject>;
}
interface OpenApi {
  paths: Record<string, Record<string, Operation>>;
  components: {
    responses?: Record<string, ResponseObject>;
    schemas: Record<string, unknown>;
  };
}

const committed = readFileSync(fileURLToPath(new URL('../openapi.yaml', import.meta.url)), 'utf8');
const doc = parse(committed) as OpenApi;
const ajv = new Ajv2020({ strict: false, allErrors: true });
ajv.addSchema({ $id: 'https://gateway.example/openapi', components: doc.components });

function documentedResponse(path: string, method: string, status: string): ResponseObject {
  const response = doc.paths[path]![method]!.responses[status]!;
  return response.$ref === undefined
    ? response
    : doc.components.responses![response.$ref.split('/').at(-1)!]!;
}

function responseSchema(
  path: string,
  method: string,
  status: string,
): { mediaType: string; schema: unknown } {
  const [mediaType, media] = Object.entries(documentedResponse(path, method, status).content!)[0]!;
  return { mediaType, schema: media.schema };
}

/** Checks `body` against a schema of the document (a `$ref` to a component, or one written in place). */
function validate(schema: unknown, body: unknown): string {
  // The schema's references into the document, made absolute (the document is registered under its own id).
  const absolute = JSON.parse(
    JSON.stringify(schema).replaceAll('"#/components/', '"https://gateway.example/openapi#/components/'),
  ) as object;
  const check = ajv.compile({ $id: `https://gateway.example/r${Math.random()}`, allOf: [absolute] });
  return check(body) ? '' : ajv.errorsText(check.errors);
}

const key = `Bearer ${API_KEYS[1]}`;

describe('openapi.yaml', () => {
  it('is what the routes and the contracts generate (npm run openapi)', () => {
    // On failure: npm run openapi (at the root), and commit the file.
    expect(committed).toBe(renderOpenApiYaml(gatewayApiDocument()));
  });
});

describe('openapi.yaml describes the management API exactly', () => {
  let gw: GatewayFixture;
  let unloaded: GatewayFixture;
  let offline: GatewayApp;
  let offlineDb: { destroy(): Promise<void> };

  beforeAll(async () => {
    gw = await startGateway();
    unloaded = await startGateway({ load: false });
    // A gateway whose database cannot be reached (nothing listens on that port).
    const config = loadGatewayConfig({
      DATABASE_URL: `postgres://u:p@127.0.0.1:${await freePort('tcp')}/x`,
      GATEWAY_API_KEYS: API_KEYS.join(','),
    });
    const db = createDb<GatewayDatabase>(config.database.url, {
      max: 1,
      connectionTimeoutMs: 1000,
      logger: { warn: () => undefined },
    });
    offlineDb = db;
    const keys = new SecretSet(API_KEYS);
    offline = buildApp({
      config,
      logger: createLogger({ service: 'offline', level: 'error' }),
      db,
      apiKeys: () => keys,
    });
    // Clustered (design §3.6, the default) with the registry it had before the database went away: a settings
    // push is accepted only once the bus has committed it, so here it must answer 503, not pretend.
    offline.state.replaceRegistry(await loadRegistry(gw.reader));
  });

  afterAll(async () => {
    await offlineDb.destroy();
    await gw.close();
    await unloaded.close();
  });

  it('documents every route the app registers, and nothing else', () => {
    const routes = [
      ...gatewayRoutes({} as never, (_req, _res, next) => next()),
      ...overrideRoutes(
        {} as never,
        apiKeyStep((_req, _res, next) => next()),
      ),
    ];
    const registered = routes.map((r) => `${r.method.toLowerCase()} ${r.path}`).sort();
    const documented = Object.entries(doc.paths)
      .flatMap(([path, ops]) => Object.keys(ops).map((m) => `${m} ${path.replace(/\{(\w+)\}/g, ':$1')}`))
      .sort();
    expect(documented).toEqual(registered);
  });

  it('the schema check can fail', () => {
    expect(validate({ $ref: '#/components/schemas/GatewayOkResponse' }, { status: 'reloaded' })).not.toBe('');
    expect(validate({ $ref: '#/components/schemas/ProblemDocument' }, { status: 400 })).not.toBe('');
    // A problem's schema is written in place: the document's, narrowed to the codes of its status.
    const unauthorized = responseSchema('/api/config', 'get', '401').schema;
    expect(validate(unauthorized, { status: 400 })).not.toBe('');
    expect(
      validate(unauthorized, {
        type: 'about:blank',
        title: 'Not found',
        status: 404,
        detail: 'x',
        code: 'not_found',
        request_id: 'r',
      }),
    ).not.toBe('');
  });

  const notify = (path: string) => ({
    device_id: 'acme-hq-hvac-01',
    settings: { reporting_interval_s: path.length },
  });
  type Scenario = (path: string) => request.Test | Promise<request.Response>;
  const scenarios: Record<string, Scenario> = {
    'get /api/health 200': (p) => request(gw.app.http).get(p),
    'get /api/ready 200': (p) => request(gw.app.http).get(p),
    'get /api/ready 503': (p) => request(unloaded.app.http).get(p),
    'get /api/config 200': (p) => request(gw.app.http).get(p).set('Authorization', key),
    'get /api/config 401': (p) => request(gw.app.http).get(p),
    'post reload 200': (p) => request(gw.app.http).post(p).set('Authorization', key),
    'post reload 401': (p) => request(gw.app.http).post(p),
    'post reload 503': (p) => request(offline.http).post(p).set('Authorization', key),
    ...bodyErrors('post reload'),
    'post notify 200': (p) => request(gw.app.http).post(p).set('Authorization', key).send(notify(p)),
    'post notify 400': (p) => request(gw.app.http).post(p).set('Authorization', key).send({ device_id: 'x' }),
    'post notify 401': (p) => request(gw.app.http).post(p).send(notify(p)),
    'post notify 404': (p) =>
      request(gw.app.http)
        .post(p)
        .set('Authorization', key)
        .send({ device_id: 'nope', settings: { telemetry_enabled: true } }),
    'post notify 413': (p) =>
      request(gw.app.http)
        .post(p)
        .set('Authorization', key)
        .set('Content-Type', 'application/json')
        .send(`{"device_id":"${'a'.repeat(70000)}"}`),
    'post notify 503': (p) => request(offline.http).post(p).set('Authorization', key).send(notify(p)),
    'get /api/devices 200': (p) =>
      request(gw.app.http).get(`${p}?delivery=unobserved&limit=2`).set('Authorization', key),
    'get /api/devices 400': (p) => request(gw.app.http).get(`${p}?limit=0`).set('Authorization', key),
    'get /api/devices 401': (p) => request(gw.app.http).get(p),
    'get /api/devices 503': (p) => request(offline.http).get(p).set('Authorization', key),
    'get /api/devices/{device_id} 200': () =>
      request(gw.app.http).get('/api/devices/acme-hq-hvac-01').set('Authorization', key),
    'get /api/devices/{device_id} 401': () => request(gw.app.http).get('/api/devices/acme-hq-hvac-01'),
    'get /api/devices/{device_id} 404': () =>
      request(gw.app.http).get('/api/devices/acme-hq-meter-02').set('Authorization', key),
    'get /api/devices/{device_id} 503': () =>
      request(offline.http).get('/api/devices/acme-hq-hvac-01').set('Authorization', key),
    'post /api/rollouts 201': (p) =>
      request(gw.app.http).post(p).set('Authorization', key).send(rolloutBody('acme-hq-hvac-01')),
    'post /api/rollouts 400': (p) =>
      request(gw.app.http).post(p).set('Authorization', key).send({ selector: {}, plan: {} }),
    'post /api/rollouts 401': (p) => request(gw.app.http).post(p).send(rolloutBody('acme-hq-hvac-01')),
    'post /api/rollouts 409': async (p) => {
      await fixtures();
      return request(gw.app.http).post(p).set('Authorization', key).send(rolloutBody(ACTIVE_DEVICE));
    },
    'post /api/rollouts 503': (p) =>
      request(offline.http).post(p).set('Authorization', key).send(rolloutBody('acme-hq-hvac-01')),
    'post /api/rollouts 413': bodyErrors('post /api/rollouts')['post /api/rollouts 413']!,
    'post /api/rollouts 415': bodyErrors('post /api/rollouts')['post /api/rollouts 415']!,
    'get /api/rollouts 200': async (p) => {
      await fixtures();
      return request(gw.app.http).get(`${p}?limit=1`).set('Authorization', key);
    },
    'get /api/rollouts 400': (p) => request(gw.app.http).get(`${p}?limit=0`).set('Authorization', key),
    'get /api/rollouts 401': (p) => request(gw.app.http).get(p),
    'get /api/rollouts 503': (p) => request(offline.http).get(p).set('Authorization', key),
    'get /api/rollouts/{rollout_id} 200': async () =>
      request(gw.app.http)
        .get(`/api/rollouts/${(await fixtures()).active}`)
        .set('Authorization', key),
    'get /api/rollouts/{rollout_id} 401': async () =>
      request(gw.app.http).get(`/api/rollouts/${(await fixtures()).active}`),
    'get /api/rollouts/{rollout_id} 404': () =>
      request(gw.app.http).get(`/api/rollouts/${UNKNOWN_ROLLOUT}`).set('Authorization', key),
    'get /api/rollouts/{rollout_id} 503': () =>
      request(offline.http).get(`/api/rollouts/${UNKNOWN_ROLLOUT}`).set('Authorization', key),
    ...(Object.fromEntries(
      ['pause', 'resume', 'cancel', 'rollback'].flatMap((action) => {
        const path = `/api/rollouts/{rollout_id}/${action}`;
        const at = (id: string) => `/api/rollouts/${id}/${action}`;
        return [
          // In the document's order: pause, resume, cancel, roll back the same rollout.
          [
            `post ${path} 200`,
            async () =>
              request(gw.app.http)
                .post(at((await fixtures()).active))
                .set('Authorization', key),
          ],
          [`post ${path} 401`, async () => request(gw.app.http).post(at((await fixtures()).active))],
          [
            `post ${path} 404`,
            () => request(gw.app.http).post(at(UNKNOWN_ROLLOUT)).set('Authorization', key),
          ],
          // Nothing may be done to a rolled-back rollout.
          [
            `post ${path} 409`,
            async () =>
              request(gw.app.http)
                .post(at((await fixtures()).rolledBack))
                .set('Authorization', key),
          ],
          [
            `post ${path} 503`,
            () => request(offline.http).post(at(UNKNOWN_ROLLOUT)).set('Authorization', key),
          ],
          ...Object.entries(bodyErrors(`post ${path}`)).map(
            ([name, scenario]) => [name, () => scenario(at(UNKNOWN_ROLLOUT))] as const,
          ),
        ];
      }),
    ) as Record<string, Scenario>),
    'get /api/overrides 200': (p) => request(gw.app.http).get(`${p}?limit=5`).set('Authorization', key),
    'get /api/overrides 400': (p) => request(gw.app.http).get(`${p}?limit=0`).set('Authorization', key),
    'get /api/overrides 401': (p) => request(gw.app.http).get(p),
    'get /api/overrides 503': (p) => request(offline.http).get(p).set('Authorization', key),
    'delete /api/devices/{device_id}/override 200': () =>
      request(gw.app.http).delete('/api/devices/acme-hq-hvac-01/override').set('Authorization', key),
    'delete /api/devices/{device_id}/override 401': () =>
      request(gw.app.http).delete('/api/devices/acme-hq-hvac-01/override'),
    'delete /api/devices/{device_id}/override 404': () =>
      request(gw.app.http).delete('/api/devices/acme-hq-meter-02/override').set('Authorization', key),
    'delete /api/devices/{device_id}/override 503': () =>
      request(offline.http).delete('/api/devices/acme-hq-hvac-01/override').set('Authorization', key),
    'post notify 415': (p) =>
      request(gw.app.http).post(p).set('Authorization', key).set('Content-Type', 'text/plain').send('x'),
  };
  // What the JSON body reader answers on every route that takes a body (service-kit readJsonBody).
  function bodyErrors(family: string): Record<string, Scenario> {
    return {
      [`${family} 400`]: (p) =>
        request(gw.app.http)
          .post(p)
          .set('Authorization', key)
          .set('Content-Type', 'application/json')
          .send('{'),
      [`${family} 413`]: (p) =>
        request(gw.app.http)
          .post(p)
          .set('Authorization', key)
          .set('Content-Type', 'application/json')
          .send(`{"x":"${'a'.repeat(70000)}"}`),
      [`${family} 415`]: (p) =>
        request(gw.app.http).post(p).set('Authorization', key).set('Content-Type', 'text/plain').send('x'),
    };
  }
  const ACTIVE_DEVICE = 'acme-hq-lobby-sensor-03';
  const UNKNOWN_ROLLOUT = '00000000-0000-4000-8000-000000000000';
  const rolloutBody = (deviceId: string) => ({
    selector: { device_ids: [deviceId] },
    settings: { reporting_interval_s: 300 },
    plan: { first_wave_count: 1, success_share: 1, abort_share: 1, deadline_s: 60 },
  });
  // One rollout that the action scenarios walk through every state, and one rolled back that refuses them all.
  let made: Promise<{ active: string; rolledBack: string }> | undefined;
  const fixtures = () =>
    (made ??= (async () => {
      const make = async (deviceId: string): Promise<string> =>
        (await gw.app.service.rollouts.create(rolloutBody(deviceId))).rollout_id;
      const rolledBack = await make('acme-wh-freezer-02');
      await gw.app.service.rollouts.control(rolledBack, 'rollback');
      return { active: await make(ACTIVE_DEVICE), rolledBack };
    })());
  const scenarioFor = (path: string, method: string, status: string) => {
    const family =
      path.includes('reload') || path.includes('register')
        ? 'reload'
        : path.includes('settings')
          ? 'notify'
          : path;
    return scenarios[`${method} ${family} ${status}`];
  };

  const cases = Object.entries(doc.paths).flatMap(([path, ops]) =>
    Object.entries(ops).flatMap(([method, op]) =>
      Object.keys(op.responses).map((status) => [path, method, status] as const),
    ),
  );

  it.each(cases)(
    '%s %s → %s: the response matches the documented status, media type and schema',
    async (path, method, status) => {
      const scenario = scenarioFor(path, method, status);
      expect(scenario).toBeDefined();
      const res = await scenario!(path);
      expect(String(res.status)).toBe(status);
      const { mediaType, schema } = responseSchema(path, method, status);
      expect(res.headers['content-type']).toContain(mediaType);
      expect(validate(schema, res.body)).toBe('');
      // Every header the document says is always sent (Location, WWW-Authenticate, Retry-After) is.
      const required = Object.entries(documentedResponse(path, method, status).headers ?? {})
        .filter(([, spec]) => spec.required === true)
        .map(([header]) => header);
      expect(required.filter((header) => res.headers[header.toLowerCase()] === undefined)).toEqual([]);
    },
  );
});
