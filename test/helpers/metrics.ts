/**
 * Reading a /metrics body in a test: its samples (name, labels, value), and the label-bound check: every sample's
 * metric is declared (src/metrics/define.ts, or one of prom-client's default process metrics) and every label
 * value is in the set its declaration gives. A new metric registered without bounds, or a label fed with a user
 * name or an address, fails it.
 */
import { DECLARED, DEFAULT_LABELS, inSet, OTHER, PROCESS_PREFIX, type LabelSet } from '../../src/metrics/catalog.js';

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parseExposition(body: string): Sample[] {
  const samples: Sample[] = [];
  for (const line of body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(LABEL)) labels[l[1]!] = l[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
    samples.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return samples;
}

/** The value of the one sample of name with these labels (among others), or undefined. */
export function sampleValue(samples: Sample[], name: string, labels: Record<string, string> = {}): number | undefined {
  return samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;
}

const SUFFIXES = ['_bucket', '_sum', '_count', '_total', '_created'];

function declaredLabels(name: string): Readonly<Record<string, LabelSet>> | undefined {
  for (const candidate of [name, ...SUFFIXES.filter((s) => name.endsWith(s)).map((s) => name.slice(0, -s.length))]) {
    const spec = DECLARED.find((d) => d.name === candidate);
    if (spec) return spec.type === 'histogram' ? { ...spec.labels, le: { pattern: /^(?:\+Inf|[0-9.e+-]+)$/, max: 64, what: 'a bucket bound' } } : spec.labels;
  }
  return undefined;
}

/** What is wrong with the samples' metrics and labels (empty: every one is declared and bounded). */
export function labelBoundViolations(samples: Sample[]): string[] {
  const problems: string[] = [];
  const seen = new Map<string, Set<string>>();
  for (const s of samples) {
    const defaultMetric = s.name.startsWith(`${PROCESS_PREFIX}process_`) || s.name.startsWith(`${PROCESS_PREFIX}nodejs_`);
    const labels = declaredLabels(s.name) ?? (defaultMetric ? DEFAULT_LABELS : undefined);
    if (!labels) {
      problems.push(`${s.name}: not declared in src/metrics/ (define.ts) and not a default process metric`);
      continue;
    }
    for (const [k, v] of Object.entries(s.labels)) {
      const set = labels[k];
      if (!set) problems.push(`${s.name}: label ${k} is not declared`);
      else if (!inSet(set, v)) problems.push(`${s.name}: ${k}=${JSON.stringify(v)} is not in the declared set`);
      else if (!Array.isArray(set) && v !== OTHER) {
        const key = `${s.name} ${k}`;
        const values = seen.get(key) ?? new Set<string>();
        values.add(v);
        seen.set(key, values);
        if (values.size > (set as { max: number }).max) problems.push(`${s.name}: more than ${(set as { max: number }).max} values of ${k}`);
      }
    }
  }
  return problems;
}

export const TABLE_START = '<!-- metrics-table:start (rendered from src/metrics/ by test/metrics/docs.test.ts) -->';
export const TABLE_END = '<!-- metrics-table:end -->';

function describeSet(set: LabelSet): string {
  if (!Array.isArray(set)) return (set as { what: string }).what;
  const codes = set.filter((v) => v.startsWith('GW_ERR_'));
  const plain = set.filter((v) => !v.startsWith('GW_ERR_')).map((v) => `\`${v}\``);
  if (codes.length > 0) return [...plain, 'an error code ([errors.md](errors.md))'].join(', ');
  return plain.join(', ');
}

/** The metrics table of docs/operations.md, from the declarations (every area's file loaded by catalog.ts). */
export function renderMetricsTable(): string {
  const rows = DECLARED.filter((d) => !d.name.startsWith('gateway_test_')).map((d) => {
    const labels = Object.entries(d.labels).map(([k, set]) => `\`${k}\`: ${describeSet(set)}`).join('; ') || '—';
    return `| ${d.area} | \`${d.name}\` | ${d.type} | ${labels} | ${d.help.replaceAll('|', '\\|')} |`;
  });
  return [TABLE_START, '', '| area | metric | type | labels (their values) | what it says |', '|---|---|---|---|---|', ...rows, '', TABLE_END].join('\n');
}
