// Copies the request/response schemas of @platform/contracts (compiled: run `npx tsc -b` first)
// into openapi.yaml's components, keeping the rest of the document and its comments.
// `npm run openapi:sync -w @platform/enterprise-workflow`; test/openapi.test.ts fails on drift.
import { readFileSync, writeFileSync } from 'node:fs';
import * as contracts from '@platform/contracts';
import { parseDocument } from 'yaml';

const file = new URL('../openapi.yaml', import.meta.url);
const names = {
  UploadIntentRequest: contracts.uploadIntentRequestSchema,
  UploadIntentResponse: contracts.uploadIntentResponseSchema,
  DownloadResponse: contracts.downloadResponseSchema,
  PartUrlsRequest: contracts.partUrlsRequestSchema,
  PartUrlsResponse: contracts.partUrlsResponseSchema,
  StoredPartsResponse: contracts.storedPartsResponseSchema,
  CompleteUploadRequest: contracts.completeUploadRequestSchema,
  CompleteUploadResponse: contracts.completeUploadResponseSchema,
  DecisionRequest: contracts.decisionRequestSchema,
  DecisionResponse: contracts.decisionResponseSchema,
  ObjectCreatedEvent: contracts.objectCreatedEventSchema,
  Problem: contracts.problemDocumentSchema,
};
const doc = parseDocument(readFileSync(file, 'utf8'));
for (const [name, schema] of Object.entries(names)) {
  const { $id: _id, ...rest } = schema;
  doc.setIn(['components', 'schemas', name], doc.createNode(JSON.parse(JSON.stringify(rest))));
}
writeFileSync(file, doc.toString({ lineWidth: 0 }));
