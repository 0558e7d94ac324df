// `npm run openapi`: writes each service's OpenAPI document, generated from its routes and the contracts'
// schemas (service-kit openApiDocument). The workflow's test/openapi.test.ts fails when the committed file
// differs from what the routes generate. (The device gateway's document is still hand-written; its routes
// carry no `doc` yet.)
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { workflowApiDocument } from '@platform/enterprise-workflow';
import { renderOpenApiYaml } from '@platform/testkit';

const targets = [
  {
    file: fileURLToPath(new URL('../../services/enterprise-workflow/openapi.yaml', import.meta.url)),
    document: workflowApiDocument,
  },
];

for (const target of targets) {
  await writeFile(target.file, renderOpenApiYaml(target.document()));
  process.stdout.write(`wrote ${target.file}\n`);
}
