// openapi.yaml is the contract portal developers read, generated from the routes (`npm run openapi`): the
// committed file is what they generate, every route is documented, and every documented response status is
// produced and validates against its documented schema (for a problem, the codes listed for its status).
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { PutObjectCommand, S3Client } from '@aws-sdk/client-s3';
import { demoRowId, demoSites } from '@platform/enterprise-db';
import { createDb, createLogger } from '@platform/service-kit';
import { freePort, renderOpenApiYaml } from '@platform/testkit';
import { Ajv } from 'ajv';
import type { ValidateFunction } from 'ajv';
import addFormats from 'ajv-formats';
import type { Express } from 'express';
import request from 'supertest';
import { parse } from 'yaml';
import { buildApp } from '../src/app.js';
import type { WorkflowDb } from '../src/db/database.js';
import { workflowApiDocument } from '../src/http/api-document.js';
import { startHarness, WEBHOOK_TOKENS } from './support/harness.js';
import type { Harness } from './support/harness.js';

interface ResponseObject {
  $ref?: string;
  headers?: Record<string, unknown>;
  content?: Record<string, { schema: unknown }>;
}
interface Operation {
  responses: Record<string, ResponseObject>;
}
interface OpenApi {
  openapi: string;
  paths: Record<string, Record<string, Operation>>;
  components: {
    schemas: Record<string, unknown>;
    responses?: Record<string, ResponseObject>;
    headers?: Record<string, unknown>;
  };
}

const doc = parse(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')) as OpenApi;
const ajv = new Ajv({ strict: false, allErrors: true, validateSchema: false });
addFormats.default(ajv);
ajv.addSchema(doc, 'openapi');

const methods = ['get', 'head', 'post', 'put', 'patch', 'delete'];

function resolveResponse(response: ResponseObject): ResponseObject {
  if (response.$ref === undefined) return response;
  const name = response.$ref.replace('#/components/responses/', '');
  const resolved = doc.components.responses?.[name];
  if (resolved === undefined) throw new Error(`unresolved ${response.$ref}`);
  return resolved;
}

/** Whether a documented header (inline or `$ref` to components/headers) is always sent. */
function headerRequired(spec: unknown): boolean {
  const ref = (spec as { $ref?: string }).$ref;
  const resolved =
    ref === undefined ? spec : doc.components.headers?.[ref.replace('#/components/headers/', '')];
  return (resolved as { required?: boolean } | undefined)?.required === true;
}

const validators = new Map<string, ValidateFunction>();
function validatorFor(pointer: string): ValidateFunction {
  let validate = validators.get(pointer);
  if (validate === undefined) {
    validate = ajv.compile({ $ref: `openapi#${pointer}` });
    validators.set(pointer, validate);
  }
  return validate;
}

function escapePointer(segment: string): string {
  return segment.replace(/~/g, '~0').replace(/\//g, '~1');
}

/** Which documented path template a concrete path matches. */
function templateOf(path: string): string | undefined {
  return Object.keys(doc.paths).find((template) =>
    new RegExp(`^${template.replace(/\{[^}]+\}/g, '[^/]+')}$`).test(path),
  );
}

const observed = new Set<string>();

/** Checks `res` against the documentation of `method path` and records the status as covered. */
function conforms(method: string, path: string, res: request.Response): void {
  const template = templateOf(path);
  expect(template).toBeDefined();
  const operation = doc.paths[template!]![method.toLowerCase()];
  expect(operation).toBeDefined();
  const raw = operation!.responses[String(res.status)];
  if (raw === undefined)
    throw new Error(`${method} ${template} answered undocumented ${res.status}: ${res.text}`);
  const documented = resolveResponse(raw);
  observed.add(`${method.toUpperCase()} ${template} ${res.status}`);
  for (const [header, spec] of Object.entries(documented.headers ?? {})) {
    if (!headerRequired(spec)) continue;
    expect({ header, value: res.headers[header.toLowerCase()] }).toEqual({
      header,
      value: expect.any(String),
    });
  }
  if (documented.content === undefined) return;
  const type = (res.headers['content-type'] ?? '').split(';')[0]!.trim();
  const media = Object.keys(documented.content);
  expect(media).toContain(type);
  if (type === 'text/plain') return;
  const pointer =
    raw.$ref !== undefined
      ? `${raw.$ref.slice(1)}/content/${escapePointer(type)}/schema`
      : `/paths/${escapePointer(template!)}/${method.toLowerCase()}/responses/${res.status}/content/${escapePointer(type)}/schema`;
  const validate = validatorFor(pointer);
  if (!validate(res.body)) {
    throw new Error(
      `${method} ${template} ${res.status} body does not match: ${ajv.errorsText(validate.errors)}`,
    );
  }
}

describe('openapi.yaml', () => {
  it('is what the routes and the contracts generate (npm run openapi)', () => {
    // On failure: npm run openapi (at the root), and commit the file.
    expect(readFileSync(new URL('../openapi.yaml', import.meta.url), 'utf8')).toBe(
      renderOpenApiYaml(workflowApiDocument()),
    );
    expect(doc.openapi).toBe('3.1.0');
  });
});

describe('documented responses', () => {
  let h: Harness;
  let down: Express;
  let alice: string;
  let dave: string;
  const hq = demoSites.acmeHq.id;
  const deadDb = { db: undefined as unknown as ReturnType<typeof createDb<WorkflowDb>> };

  beforeAll(async () => {
    // Uploads in parts above 6 MiB, in parts of 5 MiB: a 7 MiB file is two parts.
    h = await startHarness({
      multipart: { thresholdBytes: 6 * 1024 * 1024, partSizeBytes: 5 * 1024 * 1024, uploadTtlS: 3600 },
    });
    [alice, dave] = await Promise.all([h.issuer.demoToken('alice'), h.issuer.demoToken('dave')]);
    // The same service against a database nobody listens on: every database call fails.
    deadDb.db = createDb<WorkflowDb>(
      `postgres://enterprise_api_login:x@127.0.0.1:${await freePort('tcp')}/none`,
      {
        connectionTimeoutMs: 500,
        logger: { warn: () => undefined },
      },
    );
    down = buildApp({
      config: {
        media: { maxImageBytes: 1000, maxVideoBytes: 1000, uploadUrlTtlS: 60, downloadUrlTtlS: 60 },
        idempotencyTtlS: 60,
        webhookTokens: WEBHOOK_TOKENS,
      },
      logger: createLogger({ service: 'openapi-test', level: 'error' }),
      db: deadDb.db,
      storage: h.storage,
      verifier: h.verifier,
    });
  });
  afterAll(async () => {
    await deadDb.db.destroy();
    await h.close();
  });

  const intents = `/sites/${hq}/media/upload-intents`;
  const decision = `/sites/${hq}/work-items/${demoRowId('work_item', 'acmeHq', 1)}/decision`;
  const hook = '/internal/media/object-created';
  const goodIntent = { filename: 'a.jpg', content_type: 'image/jpeg', size_bytes: 10 };
  const eventKey = `sites/${hq}/media/${randomUUID()}.png`;
  const event = {
    Records: [
      {
        eventName: 's3:ObjectCreated:Put',
        // A media-shaped key of no item, its object in the store (the store is asked first): 200 unknown_key,
        // or 503 with the database down.
        s3: {
          bucket: { name: 'media' },
          object: { key: eventKey, size: 1, contentType: 'image/png' },
        },
      },
    ],
  };

  it('every documented status is produced and matches its schema', async () => {
    const bearer = (t: string) => ({ Authorization: `Bearer ${t}` });
    const roleless = await h.issuer.demoToken('alice', { role: 'other' });
    const check = async (
      app: Express,
      method: 'get' | 'post' | 'head' | 'delete',
      path: string,
      init?: (r: request.Test) => request.Test,
    ) => {
      const base = request(app)[method](path);
      const res = await (init === undefined ? base : init(base));
      conforms(method, path, res);
      return res;
    };

    // Upload intents.
    const created = await check(h.app, 'post', intents, (r) => r.set(bearer(alice)).send(goodIntent));
    const mediaId = created.body.media_id as string;
    await check(h.app, 'post', intents, (r) => r.set(bearer(alice)).send({}));
    // Idempotency-Key: the first use, its replay, and the key reused for another body (409).
    for (const body of [goodIntent, goodIntent, { ...goodIntent, size_bytes: 11 }]) {
      await check(h.app, 'post', intents, (r) =>
        r.set(bearer(alice)).set('Idempotency-Key', 'openapi-intent').send(body),
      );
    }
    await check(h.app, 'post', intents, (r) => r.send(goodIntent));
    await check(h.app, 'post', intents, (r) => r.set(bearer(roleless)).send(goodIntent));
    await check(h.app, 'post', intents, (r) => r.set(bearer(dave)).send(goodIntent));
    await check(h.app, 'post', intents, (r) => r.set(bearer(alice)).send({ filename: 'x'.repeat(70_000) }));
    await check(h.app, 'post', intents, (r) =>
      r.set(bearer(alice)).set('Content-Type', 'text/plain').send('x'),
    );
    await check(down, 'post', intents, (r) => r.set(bearer(alice)).send(goodIntent));

    // Downloads.
    const dl = (id: string) => `/sites/${hq}/media/${id}/download`;
    await check(h.app, 'get', dl(demoRowId('media_item', 'acmeHq', 1)), (r) => r.set(bearer(alice)));
    await check(h.app, 'get', dl(mediaId), (r) => r.set(bearer(alice)));
    await check(h.app, 'get', dl(mediaId));
    await check(h.app, 'get', dl(mediaId), (r) => r.set(bearer(roleless)));
    await check(h.app, 'get', dl(mediaId), (r) => r.set(bearer(dave)));
    await check(down, 'get', dl(mediaId), (r) => r.set(bearer(alice)));

    // Uploads in parts: one item completed, one aborted.
    const video = { filename: 'walk.mp4', content_type: 'video/mp4', size_bytes: 7 * 1024 * 1024 };
    const planned = await check(h.app, 'post', intents, (r) => r.set(bearer(alice)).send(video));
    expect(planned.body.multipart).toMatchObject({ part_count: 2 });
    const aborted = await check(h.app, 'post', intents, (r) => r.set(bearer(alice)).send(video));
    const mp = (id: string, rest: string) => `/sites/${hq}/media/${id}/multipart${rest}`;
    const plannedId = planned.body.media_id as string;
    const abortedId = aborted.body.media_id as string;
    const urls = mp(plannedId, '/part-urls');
    const signed = await check(h.app, 'post', urls, (r) =>
      r.set(bearer(alice)).send({ parts: [{ part_number: 1 }, { part_number: 2 }] }),
    );
    await check(h.app, 'post', urls, (r) => r.set(bearer(alice)).send({}));
    await check(h.app, 'post', urls, (r) => r.send({ parts: [{ part_number: 1 }] }));
    await check(h.app, 'post', urls, (r) => r.set(bearer(roleless)).send({ parts: [{ part_number: 1 }] }));
    await check(h.app, 'post', urls, (r) => r.set(bearer(dave)).send({ parts: [{ part_number: 1 }] }));
    await check(h.app, 'post', urls, (r) => r.set(bearer(alice)).send({ parts: ['x'.repeat(70_000)] }));
    await check(h.app, 'post', urls, (r) => r.set(bearer(alice)).set('Content-Type', 'text/plain').send('x'));
    await check(down, 'post', urls, (r) => r.set(bearer(alice)).send({ parts: [{ part_number: 1 }] }));
    const etags: string[] = [];
    for (const part of signed.body.parts as Array<{ url: string; size_bytes: number }>) {
      const put = await fetch(part.url, { method: 'PUT', body: Buffer.alloc(part.size_bytes, 7) });
      expect(put.status).toBe(200);
      etags.push(put.headers.get('etag') ?? '');
    }
    const parts = mp(plannedId, '/parts');
    await check(h.app, 'get', parts, (r) => r.set(bearer(alice)));
    await check(h.app, 'get', parts);
    await check(h.app, 'get', parts, (r) => r.set(bearer(roleless)));
    await check(h.app, 'get', parts, (r) => r.set(bearer(dave)));
    await check(down, 'get', parts, (r) => r.set(bearer(alice)));
    const complete = mp(plannedId, '/complete');
    const named = { parts: etags.map((etag, i) => ({ part_number: i + 1, etag })) };
    await check(h.app, 'post', complete, (r) =>
      r.set(bearer(alice)).send({ parts: [{ part_number: 1, etag: 'x' }] }),
    );
    await check(h.app, 'post', complete, (r) => r.send(named));
    await check(h.app, 'post', complete, (r) => r.set(bearer(roleless)).send(named));
    await check(h.app, 'post', complete, (r) => r.set(bearer(dave)).send(named));
    await check(h.app, 'post', complete, (r) => r.set(bearer(alice)).send({ parts: ['x'.repeat(70_000)] }));
    await check(h.app, 'post', complete, (r) =>
      r.set(bearer(alice)).set('Content-Type', 'text/plain').send('x'),
    );
    await check(down, 'post', complete, (r) => r.set(bearer(alice)).send(named));
    await check(h.app, 'post', complete, (r) => r.set(bearer(alice)).send(named));
    const abort = mp(abortedId, '');
    await check(h.app, 'delete', abort);
    await check(h.app, 'delete', abort, (r) => r.set(bearer(roleless)));
    await check(h.app, 'delete', abort, (r) => r.set(bearer(dave)));
    await check(down, 'delete', abort, (r) => r.set(bearer(alice)));
    await check(h.app, 'delete', abort, (r) => r.set(bearer(alice)));
    // No longer pending: 409 from each call.
    await check(h.app, 'delete', abort, (r) => r.set(bearer(alice)));
    await check(h.app, 'get', mp(abortedId, '/parts'), (r) => r.set(bearer(alice)));
    await check(h.app, 'post', mp(abortedId, '/part-urls'), (r) =>
      r.set(bearer(alice)).send({ parts: [{ part_number: 1 }] }),
    );
    await check(h.app, 'post', mp(abortedId, '/complete'), (r) =>
      r.set(bearer(alice)).send({
        parts: [
          { part_number: 1, etag: 'x' },
          { part_number: 2, etag: 'y' },
        ],
      }),
    );

    // Decisions.
    await check(h.app, 'post', decision, (r) => r.set(bearer(alice)).send({ decision: 'accept' }));
    await check(h.app, 'post', decision, (r) => r.set(bearer(alice)).send({ decision: 'decline' }));
    await check(h.app, 'post', decision, (r) => r.set(bearer(alice)).send({ decision: 'nope' }));
    await check(h.app, 'post', decision, (r) => r.send({ decision: 'accept' }));
    await check(h.app, 'post', decision, (r) => r.set(bearer(roleless)).send({ decision: 'accept' }));
    await check(h.app, 'post', decision, (r) => r.set(bearer(dave)).send({ decision: 'accept' }));
    await check(h.app, 'post', decision, (r) => r.set(bearer(alice)).send({ note: 'x'.repeat(70_000) }));
    await check(h.app, 'post', decision, (r) =>
      r.set(bearer(alice)).set('Content-Type', 'text/plain').send('x'),
    );
    await check(down, 'post', decision, (r) => r.set(bearer(alice)).send({ decision: 'accept' }));

    // Webhook.
    const s3 = new S3Client({
      endpoint: h.s3.endpoint,
      region: h.s3.region,
      forcePathStyle: true,
      credentials: { accessKeyId: h.s3.accessKeyId, secretAccessKey: h.s3.secretAccessKey },
    });
    await s3.send(
      new PutObjectCommand({ Bucket: h.s3.bucket, Key: eventKey, Body: 'x', ContentType: 'image/png' }),
    );
    s3.destroy();
    await check(h.app, 'head', hook);
    await check(h.app, 'post', hook, (r) => r.set(bearer(WEBHOOK_TOKENS[0]!)).send(event));
    await check(h.app, 'post', hook, (r) => r.set(bearer(WEBHOOK_TOKENS[0]!)).send({}));
    await check(h.app, 'post', hook, (r) => r.send(event));
    await check(h.app, 'post', hook, (r) =>
      r.set(bearer(WEBHOOK_TOKENS[0]!)).send({ Records: ['x'.repeat(70_000)] }),
    );
    await check(h.app, 'post', hook, (r) =>
      r.set(bearer(WEBHOOK_TOKENS[0]!)).set('Content-Type', 'text/plain').send('x'),
    );
    await check(down, 'post', hook, (r) => r.set(bearer(WEBHOOK_TOKENS[0]!)).send(event));

    // Operations.
    await check(h.app, 'get', '/health');
    await check(h.app, 'get', '/ready');
    await check(down, 'get', '/ready');
    await check(h.app, 'get', '/metrics');

    const documented = Object.entries(doc.paths).flatMap(([path, ops]) =>
      Object.entries(ops)
        .filter(([m]) => methods.includes(m))
        .flatMap(([m, op]) =>
          Object.keys(op.responses).map((status) => `${m.toUpperCase()} ${path} ${status}`),
        ),
    );
    expect(documented.filter((d) => !observed.has(d))).toEqual([]);
  });
});
