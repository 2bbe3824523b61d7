/**
 * How every gateway metric is declared: its name (gateway_*, with its unit), its help, its type and, for each
 * label, the closed set of values it may take. The label values are decided here and nowhere else: a recorder
 * given a value outside its label's set records it as `other`, so no user name, address or free string can
 * become a series (an unbounded label is a memory leak in the process and in Prometheus alike).
 *
 * A label's set is either a list (enums, route names, kinds, error codes) or, for identifiers bounded by the
 * cluster's size (a Proxy's host ID, a version), a pattern with a cap: values matching the pattern are kept up to
 * the cap, the rest are `other`. DECLARED keeps every declaration in order, for the label-bound check of the tests
 * and for the metrics table of docs/operations.md (rendered from it, so the table cannot drift from the code).
 *
 * prom-client does the counting and the exposition format; this file adds only the bounds, which it has no notion
 * of. Callers bind a labelled child once (per connection, per tunnel) and update it on the data path: no label
 * lookup per chunk.
 */
import { Counter, Gauge, Histogram } from 'prom-client';
import { registry } from './registry.js';

/**
 * Whether this process records: only one that serves its metrics (its diagnostics listener is configured; the
 * daemon turns it on before the roles start). Elsewhere (the CLIs, a daemon nobody scrapes) every recorder is a
 * no-op and a bound child is a shared one that does nothing: the metrics then cost nothing at all.
 */
let recording = false;

export function enableMetrics(on = true): void {
  recording = on;
}

export function metricsEnabled(): boolean {
  return recording;
}

/** The child a recorder binds while recording is off: every update does nothing. */
const NOOP = Object.freeze({ inc() {}, dec() {}, set() {}, observe() {}, setToCurrentTime() {}, startTimer: () => () => 0, remove() {} });

/** The value a label takes when the one given is outside its set. */
export const OTHER = 'other';

/** Values of identifiers that only the cluster's size bounds: those matching, at most max distinct ones. */
export interface PatternSet {
  readonly pattern: RegExp;
  readonly max: number;
  /** What the values are, for the docs ("a Proxy's host ID"). */
  readonly what: string;
}

export type LabelSet = readonly string[] | PatternSet;

export type MetricType = 'counter' | 'gauge' | 'histogram';

export interface MetricSpec {
  readonly name: string;
  readonly help: string;
  readonly type: MetricType;
  /** The area of the code it describes (listeners, tunnels, ...), the docs' grouping. */
  readonly area: string;
  readonly labels: Readonly<Record<string, LabelSet>>;
  readonly buckets?: readonly number[];
}

/** Every metric declared, in declaration order. */
export const DECLARED: MetricSpec[] = [];

/** Host IDs (a Proxy's, an agent's) are UUIDs: bounded by the cluster's size, capped here besides. */
export const HOST_ID: PatternSet = { pattern: /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/, max: 256, what: "a host ID (UUID), at most 256" };

/** A release version (17.0.0, 17.1.0-dev, none): bounded by the releases in use. */
export const VERSION_SET: PatternSet = { pattern: /^(?:none|[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(?:-[0-9A-Za-z.]{1,32})?)$/, max: 16, what: 'a version (x.y.z[-pre] or none), at most 16' };

/** Whether value is in the set (a pattern's cap aside). */
export function inSet(set: LabelSet, value: string): boolean {
  return Array.isArray(set) ? set.includes(value) || value === OTHER : value === OTHER || (set as PatternSet).pattern.test(value);
}

class Bounder {
  private readonly seen = new Map<string, Set<string>>();
  constructor(private readonly labels: Readonly<Record<string, LabelSet>>) {}

  bound(label: string, value: string): string {
    const set = this.labels[label];
    if (!set) throw new Error(`metric label ${label} is not declared`);
    if (Array.isArray(set)) return set.includes(value) ? value : OTHER;
    const p = set as PatternSet;
    if (!p.pattern.test(value)) return OTHER;
    let seen = this.seen.get(label);
    if (!seen) this.seen.set(label, (seen = new Set()));
    if (seen.has(value)) return value;
    if (seen.size >= p.max) return OTHER;
    seen.add(value);
    return value;
  }

  all(values: Record<string, string>): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(values)) out[k] = this.bound(k, v);
    return out;
  }
}

interface Options<L extends string> {
  name: string;
  help: string;
  area: string;
  labels?: Record<L, LabelSet>;
  /** Runs at each scrape, before the values are read (a gauge set from the state it describes). */
  collect?: () => void | Promise<void>;
}

function declare(spec: MetricSpec): Bounder {
  if (!spec.name.startsWith('gateway_')) throw new Error(`metric ${spec.name} must be named gateway_*`);
  DECLARED.push(spec);
  return new Bounder(spec.labels);
}

/** A counter whose labels are bounded: with(values) gives the child to keep and inc(). */
export function counter<L extends string = never>(o: Options<L>) {
  const labels = (o.labels ?? {}) as Record<L, LabelSet>;
  const b = declare({ name: o.name, help: o.help, type: 'counter', area: o.area, labels });
  const c = new Counter<L>({ name: o.name, help: o.help, labelNames: Object.keys(labels) as L[], registers: [registry], ...(o.collect ? { collect: o.collect } : {}) });
  return {
    with: (values: Record<L, string>): Counter.Internal => (recording ? c.labels(b.all(values) as Record<L, string>) : (NOOP as unknown as Counter.Internal)),
    inc: (values: Record<L, string>, by = 1) => {
      if (recording) c.inc(b.all(values) as Record<L, string>, by);
    },
    metric: c,
  };
}

/** A gauge whose labels are bounded; collect (optional) sets its values at each scrape. */
export function gauge<L extends string = never>(o: Options<L>) {
  const labels = (o.labels ?? {}) as Record<L, LabelSet>;
  const b = declare({ name: o.name, help: o.help, type: 'gauge', area: o.area, labels });
  const g = new Gauge<L>({ name: o.name, help: o.help, labelNames: Object.keys(labels) as L[], registers: [registry], ...(o.collect ? { collect: o.collect } : {}) });
  return {
    with: (values: Record<L, string>): Gauge.Internal<L> => (recording ? g.labels(b.all(values) as Record<L, string>) : (NOOP as unknown as Gauge.Internal<L>)),
    set: (values: Record<L, string>, v: number) => {
      if (recording) g.set(b.all(values) as Record<L, string>, v);
    },
    bound: (values: Record<L, string>) => b.all(values) as Record<L, string>,
    metric: g,
  };
}

/** A histogram (seconds) whose labels are bounded. */
export function histogram<L extends string = never>(o: Options<L> & { buckets: readonly number[] }) {
  const labels = (o.labels ?? {}) as Record<L, LabelSet>;
  const b = declare({ name: o.name, help: o.help, type: 'histogram', area: o.area, labels, buckets: o.buckets });
  const h = new Histogram<L>({ name: o.name, help: o.help, labelNames: Object.keys(labels) as L[], buckets: [...o.buckets], registers: [registry] });
  return {
    with: (values: Record<L, string>): Histogram.Internal<L> => (recording ? h.labels(b.all(values) as Record<L, string>) : (NOOP as unknown as Histogram.Internal<L>)),
    observe: (values: Record<L, string>, v: number) => {
      if (recording) h.observe(b.all(values) as Record<L, string>, v);
    },
    metric: h,
  };
}

/** Seconds since t0 (performance.now()). */
export function secondsSince(t0: number): number {
  return (performance.now() - t0) / 1000;
}
