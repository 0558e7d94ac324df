// `npm run openapi`: writes each service's OpenAPI document, generated from its routes and the contracts'
// schemas (service-kit openApiDocument). Each service's test/openapi.test.ts fails when its committed file
// differs from what the routes generate.
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { gatewayApiDocument } from '@platform/device-gateway';
import { workflowApiDocument } from '@platform/enterprise-workflow';
import { renderOpenApiYaml } from '@platform/testkit';

const targets = [
  {
    file: fileURLToPath(new URL('../../services/enterprise-workflow/openapi.yaml', import.meta.url)),
    document: workflowApiDocument,
  },
  {
    file: fileURLToPath(new URL('../../services/device-gateway/openapi.yaml', import.meta.url)),
    document: gatewayApiDocument,
  },
];

for (const target of targets) {
  await writeFile(target.file, renderOpenApiYaml(target.document()));
  process.stdout.write(`wrote ${target.file}\n`);
}
