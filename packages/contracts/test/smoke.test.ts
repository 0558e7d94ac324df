import { placeholder } from '@platform/contracts';
test('smoke', () => {
  expect(placeholder).toBe(1);
});
