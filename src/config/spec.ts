/**
 * The schema kit behind the configuration file. A field is a Spec: it knows its documented type, its default,
 * how to turn a YAML node into a value, and how to show itself in the sample file and the docs. The gateway's
 * fields are declared with it in schema.ts; parse.ts, sample.ts and the docs test all read that one table.
 *
 * Validation walks the YAML AST, not the plain JS value, so every problem points at the node that caused it
 * (key path, line, column). A problem is recorded in the Ctx and validation goes on with the field's default,
 * so one pass reports every problem in a file.
 */
import { isAlias, isMap, isNode, isScalar, isSeq, stringify, type Document, type LineCounter, type Node } from 'yaml';
import { AddrError, formatHostPort, parseAddr, urlAuthority, type HostPort, type ParsedAddr } from '../addr.js';
import type { ErrorCode } from '../errors.js';
import { redactUrl } from '../redact.js';

// --- problems ----------------------------------------------------------------------------------------------------

export interface Issue {
  readonly code: ErrorCode;
  /** Key path such as `proxy_service.automatic_upgrades_channels.stable/v14.static_version`; '' = the document. */
  readonly path: string;
  /** 1-based. */
  readonly line: number;
  /** 1-based. */
  readonly column: number;
  /** What is wrong, without the location prefix. */
  readonly problem: string;
  readonly hint?: string;
}

/** Thrown by a field's parser: the field reports it at the value's position and falls back to its default. */
export class Invalid extends Error {
  constructor(
    message: string,
    readonly code: ErrorCode = 'GW_ERR_CONFIG_VALUE',
    readonly hint?: string,
  ) {
    super(message);
  }
}

/** Past this many problems a file is hopeless; stop collecting (keeps memory bounded on hostile input). */
const MAX_ISSUES = 50;

/** One validation pass: the document (for aliases and positions) and what has been found so far. */
export class Ctx {
  readonly issues: Issue[] = [];
  /** Resolved leaf values by key path, so that a default can refer to another field (cluster_name → nodename). */
  readonly values = new Map<string, unknown>();
  /** Top-level sections written in the file (even when empty). */
  present: ReadonlySet<string> = new Set();

  constructor(
    readonly text = '',
    readonly doc?: Document,
    readonly lines?: LineCounter,
    /** Field name → the paths of the sections that declare it, for "belongs under" hints. */
    readonly keyIndex: ReadonlyMap<string, readonly string[]> = new Map(),
  ) {}

  /** Records a problem at the start of node (a YAML node; anything else counts as the start of the file). */
  report(code: ErrorCode, path: string, node: unknown, problem: string, hint?: string): void {
    this.reportAt(code, path, isNode(node) && node.range ? node.range[0] : 0, problem, hint);
  }

  reportAt(code: ErrorCode, path: string, offset: number, problem: string, hint?: string): void {
    if (this.issues.length >= MAX_ISSUES) return;
    const pos = this.lines ? this.lines.linePos(offset) : { line: 1, col: 1 };
    this.issues.push({ code, path, line: pos.line, column: pos.col, problem, hint });
  }

  /** The node behind an alias; undefined for an absent or null value, where the field's default applies. */
  deref(node: unknown, path: string): Node | undefined {
    if (!isNode(node)) return undefined;
    let target: Node | undefined = node;
    if (isAlias(node)) {
      target = this.doc ? node.resolve(this.doc) : undefined;
      if (target === undefined) {
        this.report('GW_ERR_CONFIG_SYNTAX', path, node, `alias *${node.source} refers to no anchor defined before it`);
        return undefined;
      }
    }
    return isScalar(target) && target.value === null ? undefined : target;
  }

  /** The text of a node as written in the file. */
  sourceOf(node: Node): string {
    return node.range ? this.text.slice(node.range[0], node.range[1]) : '';
  }

  /**
   * The entries of a mapping by key name. Reports a node that is not a mapping, keys that are not names and
   * duplicate keys (the first one wins).
   */
  entries(node: Node, path: string, expected: string): Map<string, { key: Node; value: unknown }> {
    const out = new Map<string, { key: Node; value: unknown }>();
    if (!isMap(node)) {
      this.report('GW_ERR_CONFIG_TYPE', path, node, `expected ${expected}, got ${describeNode(node)}`);
      return out;
    }
    for (const pair of node.items) {
      const key = this.deref(pair.key, path);
      if (key === undefined || !isScalar(key)) {
        const at = key ?? (isNode(pair.key) ? pair.key : isNode(pair.value) ? pair.value : node);
        this.report('GW_ERR_CONFIG_TYPE', path, at, `expected a key name, got ${key ? describeNode(key) : 'nothing'}`);
        continue;
      }
      const name = typeof key.value === 'string' ? key.value : this.sourceOf(key);
      const first = out.get(name);
      if (first) {
        const line = this.lines && first.key.range ? this.lines.linePos(first.key.range[0]).line : undefined;
        this.report(
          'GW_ERR_CONFIG_DUPLICATE_KEY',
          join(path, name),
          key,
          `duplicate key \`${name}\`${line === undefined ? '' : ` (first at line ${line})`}`,
        );
        continue;
      }
      out.set(name, { key, value: pair.value });
    }
    return out;
  }

  unknownKey(name: string, keyNode: Node, path: string, known: readonly string[]): void {
    const near = nearest(name, known);
    const elsewhere = this.keyIndex.get(name);
    const hint = near
      ? `did you mean \`${near}\`?`
      : elsewhere
        ? `\`${name}\` belongs under ${elsewhere.map((p) => (p === '' ? 'the top level' : `\`${p}\``)).join(' or ')}`
        : `known keys here: ${known.join(', ')}`;
    this.report('GW_ERR_CONFIG_UNKNOWN_KEY', path, keyNode, `unknown key \`${name}\``, hint);
  }
}

export function join(path: string, key: string): string {
  return path === '' ? key : `${path}.${key}`;
}

/** A value as shown in an error message: strings quoted (and cut short), collections by kind. */
export function describeNode(node: Node): string {
  if (isMap(node)) return 'a mapping';
  if (isSeq(node)) return 'a list';
  if (isScalar(node)) {
    const v = node.value;
    if (typeof v === 'string') return JSON.stringify(v.length > 80 ? `${v.slice(0, 77)}...` : v);
    if (v === null || v === undefined) return 'nothing';
    if (typeof v === 'number' || typeof v === 'boolean' || typeof v === 'bigint') return String(v);
    return 'binary data';
  }
  return 'an alias';
}

/** Levenshtein distance, for "did you mean" hints. */
export function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const cur = [i];
    for (let j = 1; j <= b.length; j++) {
      cur[j] = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = cur;
  }
  return prev[b.length]!;
}

/** The known key closest to name when it is close enough to be a typo (≤1 edit for short keys, ≤3 for long). */
export function nearest(name: string, known: readonly string[]): string | undefined {
  const limit = name.length <= 4 ? 1 : name.length <= 10 ? 2 : 3;
  let best: string | undefined;
  let bestDistance = limit + 1;
  for (const k of known) {
    const d = editDistance(name.toLowerCase(), k);
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return best;
}

// --- specs -------------------------------------------------------------------------------------------------------

/** A default computed at resolve time from other values (cluster_name → nodename) or the file's shape. */
export class Dynamic<T> {
  constructor(
    /** The default as the docs describe it. */
    readonly doc: string,
    readonly compute: (ctx: Ctx, path: string) => T,
    /** In the sample file: write the computed value ('value') or show it commented out ('commented'). */
    readonly inSample: 'value' | 'commented' = 'commented',
  ) {}
}

export interface Spec<T> {
  readonly kind: 'leaf' | 'section' | 'map';
  /** One line: the comment in the sample file and the description in the docs. */
  readonly doc: string;
  /** node: the value as parsed (absent, null, alias, ...); at: where to point when it is absent (its key). */
  resolve(node: unknown, path: string, ctx: Ctx, at?: Node): T;
}

export type Infer<S> = S extends Spec<infer T> ? T : never;
/** A table of fields; `any` because one table holds specs of many value types. */
export type Fields = Record<string, Spec<any>>;

export interface Leaf<T> extends Spec<T> {
  readonly kind: 'leaf';
  /** The type as the docs write it: `string`, `host:port`, `yes | no`, ... */
  readonly type: string;
  /** undefined: the field is off (or automatic) unless set; defaultDoc says what that means. */
  readonly default: T | Dynamic<T>;
  readonly defaultDoc?: string;
  /** Shown, commented out, in the sample file when the field has no default. */
  readonly example?: string;
  /** The value as YAML text. */
  render(value: T): string;
}

export interface Section<F extends Fields> extends Spec<{ readonly [K in keyof F]: Infer<F[K]> }> {
  readonly kind: 'section';
  readonly fields: F;
}

export interface MapOf<V> extends Spec<Readonly<Record<string, V>>> {
  readonly kind: 'map';
  /** The type as the docs write it: `map: channel name → channel`. */
  readonly type: string;
  /** How the docs name a key: `<channel>`. */
  readonly key: string;
  readonly value: Spec<V>;
  /** Entries shown, commented out, in the sample file: key → YAML mapping of example values. */
  readonly example: Readonly<Record<string, Readonly<Record<string, string>>>>;
}

export type AnySpec = Leaf<any> | Section<Fields> | MapOf<any>;

/** A leaf from its parts; exported so that other schemas (resource manifests) can declare their own value types. */
export function leaf<T>(o: {
  doc: string;
  type: string;
  default: T | Dynamic<T>;
  defaultDoc?: string;
  example?: string;
  render: (value: T) => string;
  /** Turns a present, non-null value into T; throws Invalid or reports (lists) through ctx. */
  parse: (node: Node, path: string, ctx: Ctx) => T;
}): Leaf<T> {
  return {
    kind: 'leaf',
    doc: o.doc,
    type: o.type,
    default: o.default,
    defaultDoc: o.defaultDoc,
    example: o.example,
    render: o.render,
    resolve(node, path, ctx) {
      const n = ctx.deref(node, path);
      const fallback = (): T => (o.default instanceof Dynamic ? (o.default as Dynamic<T>).compute(ctx, path) : o.default);
      let value: T;
      if (n === undefined) value = fallback();
      else {
        try {
          value = o.parse(n, path, ctx);
        } catch (err) {
          if (!(err instanceof Invalid)) throw err;
          ctx.report(err.code, path, n, err.message, err.hint);
          value = fallback();
        }
      }
      ctx.values.set(path, value);
      return value;
    },
  };
}

/** YAML text of a string scalar: plain when that reads back the same, quoted otherwise. */
export function yamlString(s: string): string {
  return stringify(s, { lineWidth: 0 }).trimEnd();
}

function stringOf(node: Node, expected: string, hint?: string): string {
  if (isScalar(node) && typeof node.value === 'string') return node.value;
  const numberHint = isScalar(node) && typeof node.value !== 'string' ? 'Put the value in quotes to make it a string.' : undefined;
  throw new Invalid(`expected ${expected}, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', hint ?? numberHint);
}

interface StrOpts {
  type?: string;
  defaultDoc?: string;
  example?: string;
  /** Validates and normalises; throws Invalid. */
  check?: (s: string) => string;
}

export function str(doc: string, o: StrOpts & { default: string | Dynamic<string> }): Leaf<string>;
export function str(doc: string, o?: StrOpts): Leaf<string | undefined>;
export function str(doc: string, o: StrOpts & { default?: string | Dynamic<string> } = {}): Leaf<string | undefined> {
  return leaf<string | undefined>({
    doc,
    type: o.type ?? 'string',
    default: o.default,
    defaultDoc: o.defaultDoc,
    example: o.example,
    render: (v) => (v === undefined ? '' : yamlString(v)),
    parse: (node) => {
      const s = stringOf(node, 'a string');
      return o.check ? o.check(s) : s;
    },
  });
}

/** One of a fixed set of words; matched without regard to case and stored in lowercase. */
export function oneOf<const V extends string>(doc: string, values: readonly V[], def: V): Leaf<V>;
export function oneOf<const V extends string>(
  doc: string,
  values: readonly V[],
  def: undefined,
  o: { defaultDoc: string; example: V },
): Leaf<V | undefined>;
export function oneOf<const V extends string>(
  doc: string,
  values: readonly V[],
  def: V | undefined,
  o: { defaultDoc?: string; example?: V } = {},
): Leaf<V | undefined> {
  const allowed = values.join(', ');
  return leaf<V | undefined>({
    doc,
    type: values.join(' | '),
    default: def,
    ...o,
    render: (v) => v ?? '',
    parse: (node) => {
      const s = stringOf(node, `one of ${allowed}`).toLowerCase();
      if (!(values as readonly string[]).includes(s)) throw new Invalid(`expected one of ${allowed}; got ${describeNode(node)}`);
      return s as V;
    },
  });
}

const YES = new Set(['yes', 'true', 'on']);
const NO = new Set(['no', 'false', 'off']);

/** A switch: YAML booleans, or the words yes/no (also true/false, on/off) in any case, quoted or not. */
export function flag(doc: string, def: boolean | Dynamic<boolean>): Leaf<boolean> {
  return leaf<boolean>({
    doc,
    type: 'yes | no',
    default: def,
    render: (v) => (v ? '"yes"' : '"no"'),
    parse: (node) => {
      if (isScalar(node) && typeof node.value === 'boolean') return node.value;
      const s = stringOf(node, 'yes or no').toLowerCase();
      if (YES.has(s)) return true;
      if (NO.has(s)) return false;
      throw new Invalid(`expected yes or no (or true/false), got ${describeNode(node)}`);
    },
  });
}

const LISTEN_HINT = 'Write listen addresses as host:port, :port (every interface) or [IPv6]:port, in quotes when they start with "[".';

/**
 * A listen address: "host:port", ":port" (every interface, stored as host 0.0.0.0), "[v6]:port", or a host alone
 * (takes the field's default port). Port 0 asks the OS for a free port.
 */
export function listen(doc: string, o: { port: number; default: string | Dynamic<string> }): Leaf<HostPort>;
export function listen(doc: string, o: { port: number; defaultDoc: string }): Leaf<HostPort | undefined>;
export function listen(doc: string, o: { port: number; default?: string | Dynamic<string>; defaultDoc?: string }): Leaf<HostPort | undefined> {
  const toHostPort = (text: string): HostPort => {
    const a = parseAddr(text, { allowEmptyHost: true, allowPortZero: true });
    return { host: a.host === '' ? '0.0.0.0' : a.host, port: a.port ?? o.port };
  };
  return leaf<HostPort | undefined>({
    doc,
    type: 'host:port',
    default:
      o.default === undefined
        ? undefined
        : o.default instanceof Dynamic
          ? new Dynamic(o.default.doc, (ctx, path) => toHostPort((o.default as Dynamic<string>).compute(ctx, path)))
          : toHostPort(o.default),
    defaultDoc: o.defaultDoc,
    example: `0.0.0.0:${o.port}`,
    render: (v) => (v === undefined ? '' : yamlString(formatHostPort(v.host, v.port))),
    parse: (node) => {
      const hint = isScalar(node) && typeof node.value === 'number' ? `Write ":${node.value}" to listen on every interface.` : undefined;
      const text = stringOf(node, 'host:port', hint);
      try {
        return toHostPort(text);
      } catch (err) {
        if (err instanceof AddrError) throw new Invalid(`expected host:port, got ${describeNode(node)} (${err.message})`, 'GW_ERR_CONFIG_ADDR', err.hint ?? LISTEN_HINT);
        throw err;
      }
    },
  });
}

/**
 * One address or a list of them, each an IP or DNS name with an optional port; always stored as a list. With a
 * default port every entry gets a port (HostPort); without one, a missing port stays undefined (ParsedAddr).
 */
export function addrs(doc: string, defaultPort: number): Leaf<readonly HostPort[]>;
export function addrs(doc: string): Leaf<readonly ParsedAddr[]>;
export function addrs(doc: string, defaultPort?: number): Leaf<readonly ParsedAddr[]> {
  const one = (node: Node, path: string, ctx: Ctx): ParsedAddr | undefined => {
    try {
      const a = parseAddr(stringOf(node, 'an IP address or DNS name, with an optional port'));
      return { host: a.host, port: a.port ?? defaultPort };
    } catch (err) {
      if (err instanceof Invalid) ctx.report(err.code, path, node, err.message, err.hint);
      else if (err instanceof AddrError) {
        ctx.report('GW_ERR_CONFIG_ADDR', path, node, `expected a host or host:port, got ${describeNode(node)} (${err.message})`, err.hint);
      } else throw err;
      return undefined;
    }
  };
  return leaf<readonly ParsedAddr[]>({
    doc,
    type: 'host[:port] or a list of them',
    default: [],
    render: (v) => `[${v.map((a) => yamlString(a.port === undefined ? a.host : formatHostPort(a.host, a.port))).join(', ')}]`,
    parse: (node, path, ctx) => {
      if (isMap(node)) throw new Invalid(`expected a host, host:port or a list of them, got a mapping`, 'GW_ERR_CONFIG_TYPE');
      if (!isSeq(node)) {
        const a = one(node, path, ctx);
        return a ? [a] : [];
      }
      const out: ParsedAddr[] = [];
      node.items.forEach((item, i) => {
        const p = `${path}[${i}]`;
        const n = ctx.deref(item, p);
        if (n === undefined) ctx.report('GW_ERR_CONFIG_TYPE', p, isNode(item) ? item : node, 'expected a host or host:port, got nothing');
        else {
          const a = one(n, p, ctx);
          if (a) out.push(a);
        }
      });
      return out;
    },
  });
}

/**
 * A mapping with fixed keys. Unknown keys are reported with the nearest known one as a hint. check() runs on the
 * resolved value when the section's own fields had no problems (so one mistake is reported once).
 */
export function section<F extends Fields>(
  doc: string,
  fields: F,
  o: {
    expected?: string;
    check?: (value: { readonly [K in keyof F]: Infer<F[K]> }, path: string, ctx: Ctx, at: Node | undefined) => void;
    /** Keys that must be written when the section itself is (reported at the section's mapping). */
    required?: readonly (keyof F & string)[];
  } = {},
): Section<F> {
  const known = Object.keys(fields);
  return {
    kind: 'section',
    doc,
    fields,
    resolve(node, path, ctx, at) {
      const n = ctx.deref(node, path);
      const before = ctx.issues.length;
      const entries = n === undefined ? new Map<string, { key: Node; value: unknown }>() : ctx.entries(n, path, o.expected ?? 'a mapping');
      for (const [name, e] of entries) if (!Object.hasOwn(fields, name)) ctx.unknownKey(name, e.key, join(path, name), known);
      if (o.required && n !== undefined && isMap(n)) {
        const unknown = [...entries.keys()].filter((name) => !Object.hasOwn(fields, name));
        for (const k of o.required) {
          const e = entries.get(k);
          // A misspelt key is reported once, as unknown (with "did you mean"), not also as missing.
          if (e === undefined && unknown.some((name) => nearest(name, known) === k)) continue;
          if (e === undefined || isNullish(e.value)) {
            // A key written with no value counts as missing; point at the key then, else at the mapping.
            ctx.report('GW_ERR_CONFIG_VALUE', join(path, k), e?.key ?? n, `missing required key \`${k}\``);
          }
        }
      }
      const value = Object.fromEntries(
        known.map((k) => {
          const e = entries.get(k);
          return [k, fields[k]!.resolve(e?.value, join(path, k), ctx, e?.key)];
        }),
      ) as { readonly [K in keyof F]: Infer<F[K]> };
      if (o.check && ctx.issues.length === before) o.check(value, path, ctx, at ?? n);
      return value;
    },
  };
}

/** Absent, or written as an empty / null scalar (not an alias: that is resolved, and reported, by the field). */
function isNullish(node: unknown): boolean {
  return node === undefined || node === null || (isScalar(node) && node.value === null);
}

/** An integer in [min, max]; YAML integers only (2.5, "3" and true are type errors). */
export function int(doc: string, o: { min: number; max: number; default: number | Dynamic<number> }): Leaf<number>;
export function int(doc: string, o: { min: number; max: number; defaultDoc?: string; example?: string }): Leaf<number | undefined>;
export function int(
  doc: string,
  o: { min: number; max: number; default?: number | Dynamic<number>; defaultDoc?: string; example?: string },
): Leaf<number | undefined> {
  const range = `an integer from ${o.min} to ${o.max}`;
  return leaf<number | undefined>({
    doc,
    type: `integer ${o.min}..${o.max}`,
    default: o.default,
    defaultDoc: o.defaultDoc,
    example: o.example,
    render: (v) => (v === undefined ? '' : String(v)),
    parse: (node) => {
      if (!isScalar(node) || typeof node.value !== 'number') {
        const hint = isScalar(node) && typeof node.value === 'string' && /^\s*-?\d+\s*$/.test(node.value) ? 'Write the number without quotes.' : undefined;
        throw new Invalid(`expected ${range}, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', hint);
      }
      if (!Number.isInteger(node.value)) throw new Invalid(`expected ${range}, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE');
      if (node.value < o.min || node.value > o.max) throw new Invalid(`expected ${range}, got ${describeNode(node)}`);
      return node.value;
    },
  });
}

/** A list whose items are resolved by one spec (a leaf or a section); a leaf to the docs, with the item's rows. */
export interface ListOf<V> extends Leaf<V[] | undefined> {
  readonly item: Spec<V>;
}

export function isListOf(spec: unknown): spec is ListOf<unknown> {
  return typeof spec === 'object' && spec !== null && (spec as { kind?: unknown }).kind === 'leaf' && 'item' in spec;
}

/**
 * A YAML sequence of items resolved by item. An empty (null) item is reported; an item that has a problem is left
 * out of the value. min: fewest items; unique: the identity of an item (after normalisation) for a duplicate check;
 * absent lists are undefined unless a default is given.
 */
export function listOf<V>(
  doc: string,
  item: Spec<V>,
  o: { type: string; expected: string; min?: number; max?: number; unique?: (v: V) => string; default?: V[]; defaultDoc?: string },
): ListOf<V> {
  const base = leaf<V[] | undefined>({
    doc,
    type: o.type,
    default: o.default,
    defaultDoc: o.defaultDoc,
    render: (v) => (v === undefined ? '' : stringify(v, { flowCollectionPadding: false, collectionStyle: 'flow', lineWidth: 0 }).trimEnd()),
    parse: (node, path, ctx) => {
      if (!isSeq(node)) {
        const source = isScalar(node) && node.value !== null ? ctx.sourceOf(node) : '';
        const hint = source !== '' && source.length <= 60 && !source.includes('\n') ? `Write a list even for one item: [${source}]` : undefined;
        throw new Invalid(`expected ${o.expected}, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', hint);
      }
      if (o.max !== undefined && node.items.length > o.max) throw new Invalid(`expected at most ${o.max} items, got ${node.items.length}`);
      const out: V[] = [];
      const seen = new Map<string, number>();
      node.items.forEach((raw, i) => {
        const p = `${path}[${i}]`;
        if (isNullish(raw)) {
          ctx.report('GW_ERR_CONFIG_TYPE', p, isNode(raw) && raw.range ? raw : node, 'expected a value, got nothing');
          return;
        }
        const before = ctx.issues.length;
        const v = item.resolve(raw, p, ctx);
        if (ctx.issues.length !== before || v === undefined) return;
        if (o.unique) {
          const id = o.unique(v);
          const first = seen.get(id);
          if (first !== undefined) {
            ctx.report('GW_ERR_CONFIG_VALUE', p, raw, `duplicate value ${JSON.stringify(id)} (same as ${path}[${first}])`, 'Write each value once.');
            return;
          }
          seen.set(id, i);
        }
        out.push(v);
      });
      if (o.min !== undefined && node.items.length < o.min) {
        throw new Invalid(`expected at least ${o.min} item${o.min === 1 ? '' : 's'}, got ${node.items.length}`);
      }
      return out;
    },
  });
  return { ...base, item };
}

/** A mapping from names the user chooses (checked by checkKey, which throws Invalid) to values of one spec. */
export function mapOf<V>(
  doc: string,
  o: {
    type: string;
    key: string;
    checkKey: (name: string) => void;
    value: Spec<V>;
    expected: string;
    example: Record<string, Record<string, string>>;
  },
): MapOf<V> {
  return {
    kind: 'map',
    doc,
    type: o.type,
    key: o.key,
    value: o.value,
    example: o.example,
    resolve(node, path, ctx) {
      const n = ctx.deref(node, path);
      if (n === undefined) return {};
      const out: Array<[string, V]> = [];
      for (const [name, e] of ctx.entries(n, path, o.expected)) {
        const p = join(path, name);
        try {
          o.checkKey(name);
        } catch (err) {
          if (!(err instanceof Invalid)) throw err;
          ctx.report(err.code, p, e.key, err.message, err.hint);
          continue;
        }
        out.push([name, o.value.resolve(e.value, p, ctx, e.key)]);
      }
      // fromEntries defines own properties, so a name such as __proto__ stays a plain key.
      return Object.fromEntries(out);
    },
  };
}

// --- walking the table (docs, sample, hints) ----------------------------------------------------------------------

export interface FieldRow {
  /** Key path; a user-chosen map key appears as its placeholder (`<channel>`). */
  readonly path: string;
  readonly spec: AnySpec;
}

/** Every section, map and leaf under spec, depth first, in declaration order. */
export function fieldRows(spec: AnySpec, path = ''): FieldRow[] {
  const rows: FieldRow[] = path === '' ? [] : [{ path, spec }];
  if (spec.kind === 'section') {
    for (const [k, child] of Object.entries(spec.fields)) rows.push(...fieldRows(child as AnySpec, join(path, k)));
  } else if (spec.kind === 'map') {
    rows.push(...fieldRows(spec.value as AnySpec, join(path, spec.key)));
  } else if (isListOf(spec)) {
    // The items of a list of sections: `spec.allow.rules[].verbs`.
    rows.push(...fieldRows(spec.item as AnySpec, `${path}[]`));
  }
  return rows;
}

/** Field name → paths of the sections that declare it. */
export function keyIndex(root: AnySpec): Map<string, string[]> {
  const index = new Map<string, string[]>();
  for (const { path } of fieldRows(root)) {
    const dot = path.lastIndexOf('.');
    const [parent, name] = dot < 0 ? ['', path] : [path.slice(0, dot), path.slice(dot + 1)];
    index.set(name, [...(index.get(name) ?? []), parent]);
  }
  return index;
}

/** The default of a leaf as the docs show it. */
export function defaultText(spec: Leaf<unknown>): string {
  if (spec.default instanceof Dynamic) return spec.default.doc;
  if (spec.default === undefined) return spec.defaultDoc ?? 'none';
  return `\`${spec.render(spec.default)}\``;
}

// --- agents' resources: labels, addresses with a port, lists of named items ----------------------------------------

/** Label names: letters, digits, ".", "_", "-" and "/" (`env`, `gateway.dev/team`). */
const LABEL_NAME = /^[A-Za-z0-9._/-]+$/;
/** Longest part of a label name between slashes. */
export const LABEL_NAME_SEGMENT_MAX = 63;
/** Longest label value, in characters. */
export const LABEL_VALUE_MAX = 256;
const LABEL_NAME_HINT = 'Label names are letters, digits, ".", "_", "-" and "/", each part between slashes 1 to 63 characters: env, gateway.dev/team.';
const LABELS_HINT = 'Write labels as a mapping of names to strings: labels: {env: prod, team: "42"}';

/**
 * Labels of a resource: a mapping of label name → string, `{}` by default. Names are letters, digits, ".", "_",
 * "-" and "/", with each part between slashes 1 to 63 characters; values are strings of at most 256 characters.
 * Numbers and booleans are refused (quote them), as is a name written with no value. Each problem is reported
 * at its own key or value.
 */
export function labels(doc: string): Leaf<Readonly<Record<string, string>>> {
  return leaf<Readonly<Record<string, string>>>({
    doc,
    type: 'map: label name → string',
    default: {},
    render: (v) => (Object.keys(v).length === 0 ? '{}' : stringify(v, { flowCollectionPadding: false, collectionStyle: 'flow', lineWidth: 0 }).trimEnd()),
    parse: (node, path, ctx) => {
      if (!isMap(node)) throw new Invalid(`expected a mapping of label names to strings, got ${describeNode(node)}`, 'GW_ERR_CONFIG_TYPE', LABELS_HINT);
      const out: Array<[string, string]> = [];
      for (const [name, e] of ctx.entries(node, path, 'a mapping of label names to strings')) {
        const p = join(path, name);
        const bad = labelNameProblem(name);
        if (bad !== undefined) {
          ctx.report('GW_ERR_CONFIG_VALUE', p, e.key, bad, LABEL_NAME_HINT);
          continue;
        }
        const before = ctx.issues.length;
        const v = ctx.deref(e.value, p);
        if (v === undefined) {
          // A name with no value; an alias to no anchor has been reported by deref.
          if (ctx.issues.length === before) ctx.report('GW_ERR_CONFIG_TYPE', p, e.key, 'expected a string, got nothing', 'Write "" for an empty value.');
          continue;
        }
        if (!isScalar(v) || typeof v.value !== 'string') {
          const hint = isScalar(v) ? `Put the value in quotes to make it a string: ${name}: "${ctx.sourceOf(v)}"` : LABELS_HINT;
          ctx.report('GW_ERR_CONFIG_TYPE', p, v, `expected a string, got ${describeNode(v)}`, hint);
          continue;
        }
        const length = [...v.value].length;
        if (length > LABEL_VALUE_MAX) {
          ctx.report('GW_ERR_CONFIG_VALUE', p, v, `a label value may have at most ${LABEL_VALUE_MAX} characters, this one has ${length}`);
          continue;
        }
        out.push([name, v.value]);
      }
      // fromEntries defines own properties, so a name such as __proto__ stays a plain key.
      return Object.fromEntries(out);
    },
  });
}

/** Why name is not a label name, or undefined when it is one. */
export function labelNameProblem(name: string): string | undefined {
  if (!LABEL_NAME.test(name)) return `label name ${JSON.stringify(name)} may only hold letters, digits, ".", "_", "-" and "/"`;
  const parts = name.split('/');
  if (parts.some((part) => part === '')) return `label name ${JSON.stringify(name)} has an empty part between slashes`;
  const long = parts.find((part) => part.length > LABEL_NAME_SEGMENT_MAX);
  if (long !== undefined) {
    return `label name ${JSON.stringify(name)} has a part of ${long.length} characters; each part between slashes may have at most ${LABEL_NAME_SEGMENT_MAX}`;
  }
  return undefined;
}

/**
 * The address of something an agent reaches: host:port (IP or DNS name), stored as {host, port}. With a default
 * port the port may be left out (host[:port]); without one it is required. No default: list items require it.
 */
export function hostPort(doc: string, o: { port?: number; example: string; defaultDoc?: string }): Leaf<HostPort | undefined> {
  const type = o.port === undefined ? 'host:port' : 'host[:port]';
  const hint = o.port === undefined
    ? `Write the host and its port, e.g. ${o.example}; IPv6 addresses in brackets: "[2001:db8::1]:5432".`
    : `Write a host, or host:port, e.g. ${o.example}; IPv6 addresses with a port in brackets: "[2001:db8::1]:${o.port}".`;
  return leaf<HostPort | undefined>({
    doc,
    type,
    default: undefined,
    defaultDoc: o.defaultDoc ?? 'none',
    example: o.example,
    render: (v) => (v === undefined ? '' : yamlString(formatHostPort(v.host, v.port))),
    parse: (node) => {
      const text = stringOf(node, type);
      if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(text.trim())) {
        throw new Invalid(`expected ${type}, got ${describeNode(node)} (write the address without a scheme)`, 'GW_ERR_CONFIG_ADDR', hint);
      }
      let a: ParsedAddr;
      try {
        a = parseAddr(text);
      } catch (err) {
        if (err instanceof AddrError) throw new Invalid(`expected ${type}, got ${describeNode(node)} (${err.message})`, 'GW_ERR_CONFIG_ADDR', err.hint ?? hint);
        throw err;
      }
      const port = a.port ?? o.port;
      if (port === undefined) throw new Invalid(`expected host:port, got ${describeNode(node)} (the port is required)`, 'GW_ERR_CONFIG_ADDR', hint);
      return { host: a.host, port };
    },
  });
}

/** The value of an item section whose required keys are typed as always set. */
export type ItemValue<F extends Fields, R extends keyof F> = {
  readonly [K in keyof F]: K extends R ? Exclude<Infer<F[K]>, undefined> : Infer<F[K]>;
};

export interface ItemSection<F extends Fields, R extends keyof F> extends Spec<ItemValue<F, R>> {
  readonly kind: 'section';
  readonly fields: F;
}

/**
 * A section for the items of a list (listOf, listWithDefault): like section(), but the keys in `required` are
 * typed without undefined. That holds because a missing one is always reported (also when the item is an alias
 * to nothing), and a list leaves out an item that has a problem, and parseConfig() throws on any problem. Use it
 * only as a list item: a section that is absent from the file is not checked for required keys.
 */
export function itemSection<F extends Fields, const R extends keyof F & string>(
  doc: string,
  fields: F,
  o: {
    required: readonly R[];
    expected?: string;
    check?: (value: ItemValue<F, R>, path: string, ctx: Ctx, at: Node | undefined) => void;
  },
): ItemSection<F, R> {
  const inner = section(doc, fields, {
    required: o.required,
    expected: o.expected,
    check: o.check as ((value: { readonly [K in keyof F]: Infer<F[K]> }, path: string, ctx: Ctx, at: Node | undefined) => void) | undefined,
  });
  return {
    kind: 'section',
    doc,
    fields,
    resolve(node, path, ctx, at) {
      const before = ctx.issues.length;
      const value = inner.resolve(node, path, ctx, at) as Record<string, unknown>;
      if (ctx.issues.length === before) {
        // Nothing reported, yet a required key is unset: the item is an alias to nothing (`- *empty`).
        const n = ctx.deref(node, path);
        const missing = o.required.filter((k) => value[k] === undefined);
        if (n === undefined && missing.length > 0) {
          ctx.report('GW_ERR_CONFIG_TYPE', path, isNode(node) ? node : at, `expected ${o.expected ?? 'a mapping'}, got nothing`);
        } else {
          for (const k of missing) ctx.report('GW_ERR_CONFIG_VALUE', join(path, k), n ?? at, `missing required key \`${k}\``);
        }
      }
      return value as ItemValue<F, R>;
    },
  };
}

/** A list with a default: never undefined, and typed read-only (the configuration is deeply frozen). */
export interface ListWithDefault<V> extends Leaf<readonly V[]> {
  readonly item: Spec<V>;
  /** One item as YAML text by key, for a commented-out example entry (sample file). */
  readonly exampleItem?: Readonly<Record<string, string>>;
}

/**
 * listOf() with a default (`[]` unless given): an absent, null or invalid list resolves to the default, so the
 * value is always a list. Items, min and unique work as in listOf().
 */
export function listWithDefault<V>(
  doc: string,
  item: Spec<V>,
  o: {
    type: string;
    expected: string;
    min?: number;
    max?: number;
    unique?: (v: V) => string;
    default?: readonly V[];
    defaultDoc?: string;
    exampleItem?: Readonly<Record<string, string>>;
  },
): ListWithDefault<V> {
  const { exampleItem, ...rest } = o;
  const inner = listOf(doc, item, { ...rest, default: [...(o.default ?? [])] });
  // The default is always a list, so the value is never undefined: the leaf's type narrows accordingly.
  return { ...(inner as Leaf<readonly V[]>), item, ...(exampleItem === undefined ? {} : { exampleItem }) };
}

/** Check for an http:// or https:// URL; the message shows it with any password replaced by "***". */
export function httpUrl(s: string): string {
  let url: URL | undefined;
  try {
    url = new URL(s);
  } catch {
    url = undefined;
  }
  // The host as written, checked like every address: URL() would read "1.2.3" as 1.2.0.3 and keeps "_".
  // Non-ASCII names are checked in their punycode form.
  const authority = urlAuthority(s);
  const host = authority !== undefined && /^[\x21-\x7e]*$/.test(authority) ? authority : url?.host;
  if (host) {
    try {
      parseAddr(host);
    } catch (err) {
      if (err instanceof AddrError) throw new Invalid(`expected an http:// or https:// URL, got ${JSON.stringify(redactUrl(s))} (${err.message})`, 'GW_ERR_CONFIG_ADDR', err.hint);
      throw err;
    }
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || url.hostname === '') {
    throw new Invalid(`expected an http:// or https:// URL, got ${JSON.stringify(redactUrl(s))}`);
  }
  return s;
}
