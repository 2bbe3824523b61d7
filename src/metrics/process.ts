/**
 * The process's own figures: prom-client's default metrics (CPU, memory, open file descriptors, the heap by space,
 * garbage collections, the event loop's lag and utilisation, active handles), named gateway_process_* and
 * gateway_nodejs_*. Started with the diagnostics listener (startProcessMetrics), not at import: a CLI or a test
 * that never serves /metrics runs no event-loop monitor or GC observer for nothing. Their labels are prom-client's
 * and Node's own closed sets (DEFAULT_LABELS, which the label-bound test checks them against).
 */
import { collectDefaultMetrics } from 'prom-client';
import { enableMetrics, type LabelSet } from './define.js';
import { registry } from './registry.js';

export const PROCESS_PREFIX = 'gateway_';

/** The labels of the default metrics: V8's heap spaces, the kinds of GC, Node's version. */
export const DEFAULT_LABELS: Readonly<Record<string, LabelSet>> = {
  space: { pattern: /^[a-z_]{1,40}$/, max: 32, what: "a V8 heap space (new, old, code, large_object ...)" },
  kind: ['minor', 'major', 'incremental', 'weakcb'],
  version: { pattern: /^v[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$/, max: 1, what: "Node.js's version" },
  major: { pattern: /^[0-9]{1,3}$/, max: 1, what: "Node.js's major version" },
  minor: { pattern: /^[0-9]{1,3}$/, max: 1, what: "Node.js's minor version" },
  patch: { pattern: /^[0-9]{1,3}$/, max: 1, what: "Node.js's patch version" },
  type: { pattern: /^[A-Za-z]{1,40}$/, max: 64, what: 'a kind of libuv handle or request (TCPSocketWrap, Timeout ...)' },
  le: { pattern: /^(?:\+Inf|[0-9.e+-]{1,24})$/, max: 32, what: 'a bucket bound' },
};

/**
 * prom-client adds three gauges named *_total (nodejs_active_handles_total, _requests_total, _resources_total),
 * which promtool check metrics refuses (_total is for counters). They are sums of the gauges it keeps by type
 * (nodejs_active_handles{type}, ...), so they are taken out: sum() in a query gives them back.
 */
const MISNAMED = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

let started = false;

/** Starts the default metrics once per process (later calls do nothing). */
export function startProcessMetrics(): void {
  if (started) return;
  started = true;
  enableMetrics();
  collectDefaultMetrics({ register: registry, prefix: PROCESS_PREFIX });
  for (const name of MISNAMED) registry.removeSingleMetric(`${PROCESS_PREFIX}${name}`);
}
