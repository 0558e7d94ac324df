import { fileURLToPath } from 'node:url';
import { workspaceJestConfig } from '../jest.preset.js';

export default workspaceJestConfig(fileURLToPath(new URL('.', import.meta.url)), 'scripts');
