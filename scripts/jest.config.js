import { fileURLToPath } from 'node:url';
import { standaloneJestConfig } from '../jest.preset.js';

export default standaloneJestConfig(fileURLToPath(new URL('.', import.meta.url)), 'scripts');
