/**
 * Backend metrics: the latency of each operation of the cluster's storage (src/backend/: SQLite or PostgreSQL)
 * and its failures by stable code. The answers an operation is meant to give (GW_ERR_BACKEND_EXISTS, _NOT_FOUND,
 * _CONFLICT: a create that found an item, a compare-and-swap that lost a race) are not failures and are not
 * counted as such; they are in the latency histogram with the rest.
 */
import { ERROR_CODES } from '../errors.js';
import { counter, histogram, metricsEnabled, secondsSince } from './define.js';

const NOTHING = (): void => undefined;

export const BACKENDS = ['sqlite', 'postgres'] as const;
export const BACKEND_OPERATIONS = ['get', 'range', 'put', 'create', 'update', 'compareAndSwap', 'delete', 'deleteRange', 'atomicWrite'] as const;
const ANSWERS = new Set(['GW_ERR_BACKEND_EXISTS', 'GW_ERR_BACKEND_NOT_FOUND', 'GW_ERR_BACKEND_CONFLICT']);

const AREA = 'backend';
const latency = histogram({
  name: 'gateway_backend_operation_duration_seconds',
  help: 'Time the cluster storage took for an operation, by backend and operation.',
  area: AREA,
  labels: { backend: BACKENDS, operation: BACKEND_OPERATIONS },
  buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5],
});
const errors = counter({
  name: 'gateway_backend_errors_total',
  help: 'Operations of the cluster storage that failed, by backend, operation and error code (exists, not found and conflict are answers, not failures).',
  area: AREA,
  labels: { backend: BACKENDS, operation: BACKEND_OPERATIONS, code: Object.keys(ERROR_CODES) },
});

/** An operation is starting; call the result with the error code it failed with, or undefined. */
export function startBackendOp(backend: string, operation: string): (code?: string) => void {
  if (!metricsEnabled()) return NOTHING;
  const t0 = performance.now();
  return (code) => {
    latency.observe({ backend, operation }, secondsSince(t0));
    if (code !== undefined && !ANSWERS.has(code)) errors.inc({ backend, operation, code });
  };
}
