/** The model test (model.ts) against the PostgreSQL backend on a real server (one database per sequence). */
import fc from 'fast-check';
import getPort from 'get-port';
import { afterAll, beforeAll, it } from 'vitest';
import { startPostgres, type PostgresServer } from '../helpers/databases.js';
import { rootSuite } from '../helpers/root.js';
import { postgresHarness } from './harness.js';
import { op, runSequence } from './model.js';

let server: PostgresServer;
const h = postgresHarness(() => server);

rootSuite(['dbUsers'])('postgres backend against a Map model', () => {
  beforeAll(async () => {
    server = await startPostgres({ port: await getPort({ host: '127.0.0.1' }) });
  });
  afterAll(async () => {
    await server?.stop();
  });

  it('agrees on every result, every watch event and the final state', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(op, { minLength: 1, maxLength: 40 }), (ops) => runSequence(h, ops)),
      { numRuns: 100 },
    );
  });
});
