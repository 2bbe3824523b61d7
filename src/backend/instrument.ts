/**
 * Times every storage operation of a Backend and counts its failures (src/metrics/backend.ts), by wrapping the
 * operations of the instance in place: the object stays the one the caller opened (SqliteBackend,
 * PostgresBackend), with its own extra methods, and watch() and close() are left as they are.
 */
import { toGatewayError } from '../errors.js';
import { BACKEND_OPERATIONS, startBackendOp } from '../metrics/backend.js';
import type { Backend } from './types.js';

export function instrumentBackend<B extends Backend>(backend: B, type: 'sqlite' | 'postgres'): B {
  const target = backend as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
  for (const op of BACKEND_OPERATIONS) {
    const original = target[op]!.bind(backend);
    target[op] = async (...args: unknown[]) => {
      const done = startBackendOp(type, op);
      try {
        const result = await original(...args);
        done();
        return result;
      } catch (err) {
        done(toGatewayError(err).code);
        throw err;
      }
    };
  }
  return backend;
}
