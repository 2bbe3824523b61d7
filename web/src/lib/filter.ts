/**
 * The filter box of the resource tables: pure, bounded, no regular expressions built from what is typed.
 *
 *   web           every item whose name, hostname, address or a label key or value contains "web"
 *   env=prod      every item with the label env whose value is prod (both case-insensitive, the value exact)
 *   env=          every item that has the label env, whatever its value
 *   region="eu west"  quotes keep spaces in a term
 *   web env=prod  both (terms are ANDed)
 */

/** What a filter looks at in one row. */
export interface Filterable {
  name: string;
  labels?: Record<string, string> | undefined;
  /** Other searchable text of the row: hostname, public address, protocol. */
  text?: ReadonlyArray<string | undefined>;
}

export type Term = { kind: 'text'; value: string } | { kind: 'label'; key: string; value: string | undefined };

/** A query longer than this is cut (a paste of a whole page must not make each keystroke slow). */
export const MAX_QUERY = 256;
/** At most this many terms count; the rest are ignored. */
export const MAX_TERMS = 16;

/** Splits a query into terms: whitespace separates, double quotes group, key=value is a label term. */
export function parseQuery(query: string): Term[] {
  const words: string[] = [];
  let current = '';
  let quoted = false;
  let started = false;
  for (const ch of query.slice(0, MAX_QUERY)) {
    if (ch === '"') {
      quoted = !quoted;
      started = true;
    } else if (!quoted && /\s/.test(ch)) {
      if (started) words.push(current);
      current = '';
      started = false;
    } else {
      current += ch;
      started = true;
    }
  }
  if (started) words.push(current);
  return words
    .filter((w) => w.length > 0)
    .slice(0, MAX_TERMS)
    .map((w): Term => {
      const eq = w.indexOf('=');
      if (eq <= 0) return { kind: 'text', value: w.toLowerCase() };
      const value = w.slice(eq + 1).toLowerCase();
      return { kind: 'label', key: w.slice(0, eq).toLowerCase(), value: value === '' ? undefined : value };
    });
}

function labelMatches(labels: Record<string, string>, key: string, value: string | undefined): boolean {
  for (const [k, v] of Object.entries(labels)) {
    if (k.toLowerCase() !== key) continue;
    if (value === undefined || String(v).toLowerCase() === value) return true;
  }
  return false;
}

function textMatches(item: Filterable, needle: string): boolean {
  if (item.name.toLowerCase().includes(needle)) return true;
  for (const t of item.text ?? []) if (t && t.toLowerCase().includes(needle)) return true;
  for (const [k, v] of Object.entries(item.labels ?? {})) {
    if (k.toLowerCase().includes(needle) || String(v).toLowerCase().includes(needle) || `${k}=${v}`.toLowerCase().includes(needle)) return true;
  }
  return false;
}

/** Whether one row matches every term. */
export function matchesTerms(item: Filterable, terms: readonly Term[]): boolean {
  return terms.every((t) => (t.kind === 'label' ? labelMatches(item.labels ?? {}, t.key, t.value) : textMatches(item, t.value)));
}

/** The rows that match a query, in their order. An empty query keeps every row. */
export function filterItems<T extends Filterable>(items: readonly T[], query: string): T[] {
  const terms = parseQuery(query);
  return terms.length === 0 ? [...items] : items.filter((i) => matchesTerms(i, terms));
}

/** Labels as chips, "key=value", sorted by key. */
export function labelChips(labels: Record<string, string> | undefined): string[] {
  return Object.entries(labels ?? {})
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`);
}

/** The query after clicking a chip: the chip's term added once (quoted when it holds a space or a quote). */
export function addChipToQuery(query: string, chip: string): string {
  const term = /[\s"]/.test(chip) ? `"${chip.replace(/"/g, '')}"` : chip;
  const existing = parseQuery(query);
  const parsed = parseQuery(term)[0];
  if (parsed && existing.some((t) => JSON.stringify(t) === JSON.stringify(parsed))) return query;
  return query.trim() === '' ? term : `${query.trim()} ${term}`;
}
