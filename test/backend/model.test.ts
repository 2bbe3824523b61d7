/** The model test (model.ts) against the SQLite backend. */
import fc from 'fast-check';
import { describe, it } from 'vitest';
import { sqliteHarness } from './harness.js';
import { op, runSequence } from './model.js';

describe('sqlite backend against a Map model', () => {
  it('agrees on every result, every watch event and the final state', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 40 }), (ops) => runSequence(sqliteHarness, ops)),
      { numRuns: 250 },
    );
  });
});
