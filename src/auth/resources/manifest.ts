/**
 * Manifests: YAML streams of resources (documents separated by `---`), as `gwctl create` reads them and
 * `gwctl get` writes them.
 *
 * parseManifest validates every document before returning anything: all problems of all documents become one
 * GatewayError (GW_ERR_RESOURCE_INVALID) whose details name the first problem (document, key path, line, column)
 * and list every one. Secrets (tokens, client secrets, private keys) never appear in a message.
 */
import { createHash } from 'node:crypto';
import { LineCounter, isAlias, isMap, isScalar, parseAllDocuments, stringify, type Document, type Node, type YAMLError } from 'yaml';
import { Ctx, nearest, type Issue } from '../../config/spec.js';
import { GatewayError, type ErrorCode } from '../../errors.js';
import { DOCUMENTS, KEY_INDEXES, isNullish } from './schema.js';
import { RESOURCE_KINDS, SINGLETON_NAMES, type AnyResource, type Resource, type ResourceKind } from './types.js';

/** The non-secret id of a join token: the first 12 hex digits of its SHA-256. */
export function tokenId(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex').slice(0, 12);
}

/** One problem of a manifest, as listed in GW_ERR_RESOURCE_INVALID's details.problems. */
export interface ManifestProblem {
  /** The kind of problem: a schema code (GW_ERR_CONFIG_SYNTAX, _UNKNOWN_KEY, _TYPE, _VALUE, _DUPLICATE_KEY) or GW_ERR_RESOURCE_DUPLICATE. */
  readonly code: ErrorCode;
  /** 1-based index of the document in the stream (empty documents count). */
  readonly document: number;
  /** The document's kind when it has a string one. */
  readonly kind?: string;
  /** The resource name (a token's id, never the token); only for known kinds. */
  readonly name?: string;
  /** Key path inside the document: spec.allow.rules[0].verbs[1]; '' = the document itself. */
  readonly path: string;
  readonly line: number;
  readonly column: number;
  /** The full line: `roles.yaml: document 2 (role "dev"): spec...: expected ...; got "wirte" (line 14, column 9)`. */
  readonly message: string;
  readonly hint?: string;
}

/** Aliases resolved per document before the walk gives up (keeps alias bombs from taking exponential time). */
const MAX_ALIASES = 500;
/** Problems collected over a whole manifest before giving up. */
const MAX_PROBLEMS = 100;
const MAX_LISTED = 10;

/** The schema kit's context, with a budget for aliases and a hint for an unquoted `*`. */
class ManifestCtx extends Ctx {
  private aliases = 0;

  override deref(node: unknown, path: string): Node | undefined {
    if (isAlias(node)) {
      this.aliases++;
      if (this.aliases > MAX_ALIASES) {
        if (this.aliases === MAX_ALIASES + 1) this.report('GW_ERR_CONFIG_SYNTAX', path, node, `more than ${MAX_ALIASES} aliases in one document`, 'Write the values out instead of repeating aliases.');
        return undefined;
      }
    }
    return super.deref(node, path);
  }
}

interface Parsed {
  index: number;
  kind?: string;
  /** For messages and details: a name that is safe to show. */
  name?: string;
  issues: Issue[];
  resource?: AnyResource;
  /** Where the name is written (for a duplicate), else the document start. */
  nameOffset: number;
}

/**
 * Parses and validates a manifest. source names the text in messages (usually the file name). Returns the
 * resources in document order; empty documents are skipped. Throws GW_ERR_RESOURCE_INVALID.
 */
export function parseManifest(text: string, source: string): AnyResource[] {
  try {
    return parse(text, source);
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    if (err instanceof RangeError) {
      // Nesting deep enough to exhaust the stack.
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `${source}: the manifest nests too deeply`, {
        cause: err,
        details: { source, document: 1, path: '', line: 1, column: 1, problems: [] },
      });
    }
    throw new GatewayError('GW_ERR_INTERNAL', `${source}: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  }
}

function parse(text: string, source: string): AnyResource[] {
  const lines = new LineCounter();
  // uniqueKeys off: duplicate keys are reported by the walk, which knows their key path.
  const docs = parseAllDocuments(text, { lineCounter: lines, uniqueKeys: false, prettyErrors: false });
  const parsed: Parsed[] = [];
  let problems = 0;
  for (const [i, doc] of docs.entries()) {
    if (problems >= MAX_PROBLEMS) break;
    if (doc.errors.length === 0 && isNullish(doc.contents)) continue;
    const p = parseDocument(doc, i + 1, text, lines);
    problems += p.issues.length;
    parsed.push(p);
  }
  checkDuplicates(parsed, lines);
  if (parsed.some((p) => p.issues.length > 0)) throw toError(parsed, source);
  return parsed.map((p) => p.resource!);
}

/** A string scalar value of key in a mapping node, without reporting anything. */
function peek(node: unknown, key: string): { value?: string; node?: Node } {
  if (!isMap(node)) return {};
  const pair = node.items.find((p) => isScalar(p.key) && p.key.value === key);
  if (!pair) return {};
  const value = pair.value as Node | null;
  return { value: isScalar(value) && typeof value.value === 'string' ? value.value : undefined, node: value ?? (pair.key as Node) };
}

function isKind(s: string | undefined): s is ResourceKind {
  return s !== undefined && Object.hasOwn(DOCUMENTS, s);
}

/**
 * Kinds as upstream's own documentation writes them at times (its upgrader's README: `kind:
 * cluster-maintenance-config`, the resource's name); upstream's resource code takes the same mix-up. Stored under
 * the kind's own name.
 */
const KIND_ALIASES: Readonly<Record<string, ResourceKind>> = { 'cluster-maintenance-config': 'cluster_maintenance_config' };

function knownKind(s: string | undefined): ResourceKind | undefined {
  if (isKind(s)) return s;
  return s !== undefined && Object.hasOwn(KIND_ALIASES, s) ? KIND_ALIASES[s] : undefined;
}

function parseDocument(doc: Document.Parsed, index: number, text: string, lines: LineCounter): Parsed {
  const start = doc.contents?.range?.[0] ?? doc.range[0];
  const kindPeek = peek(doc.contents, 'kind');
  const kind = kindPeek.value;
  const known = knownKind(kind);
  const metadata = peek(doc.contents, 'metadata').node;
  const namePeek = peek(metadata, 'name');
  const nameOffset = namePeek.node?.range?.[0] ?? metadata?.range?.[0] ?? start;
  const safeName =
    known === undefined
      ? undefined
      : known === 'token'
        ? namePeek.value === undefined
          ? undefined
          : tokenId(namePeek.value)
        : (namePeek.value ?? SINGLETON_NAMES[known]);
  const ctx = new ManifestCtx(text, doc, lines, known ? KEY_INDEXES[known] : new Map());
  const out: Parsed = { index, kind, name: safeName, issues: ctx.issues, nameOffset };

  if (doc.errors.length > 0) {
    for (const err of doc.errors) reportSyntax(ctx, err, text, lines);
    return out;
  }
  const root = ctx.deref(doc.contents, '');
  if (root === undefined) return out; // an alias problem, already reported
  if (!isMap(root)) {
    ctx.report('GW_ERR_CONFIG_TYPE', '', root, `expected a resource (a mapping with kind, version, metadata and spec), got ${describe(root)}`);
    return out;
  }
  if (known === undefined) {
    const kinds = RESOURCE_KINDS.join(', ');
    if (kind === 'autoupdate_agent_rollout' && kindPeek.node !== undefined) {
      ctx.report('GW_ERR_AUTOUPDATE_READ_ONLY', 'kind', kindPeek.node, 'autoupdate_agent_rollout is what the Auth Service computed: it cannot be created or applied', "Change autoupdate_config or autoupdate_version, or steer the rollout with 'gwctl autoupdate'.");
    } else if (kindPeek.node === undefined) {
      ctx.report('GW_ERR_CONFIG_VALUE', 'kind', root, 'missing required key `kind`', `Known kinds: ${kinds}.`);
    } else if (kind === undefined) {
      ctx.report('GW_ERR_CONFIG_TYPE', 'kind', kindPeek.node, `expected a kind, got ${describe(kindPeek.node)}`, `Known kinds: ${kinds}.`);
    } else {
      const near = nearest(kind, RESOURCE_KINDS);
      ctx.report(
        'GW_ERR_CONFIG_VALUE',
        'kind',
        kindPeek.node,
        `unknown kind ${JSON.stringify(kind.length > 80 ? `${kind.slice(0, 77)}...` : kind)}; known kinds: ${kinds}`,
        near ? `did you mean \`${near}\`?` : `Known kinds: ${kinds}.`,
      );
    }
    return out;
  }
  const value = DOCUMENTS[known].resolve(root, '', ctx);
  if (ctx.issues.length === 0) out.resource = clean({ ...(value as object), kind: known }) as AnyResource;
  return out;
}

/** describeNode for the document level: the kind of node only (the text may be a secret in the wrong place). */
function describe(node: Node): string {
  if (isMap(node)) return 'a mapping';
  if (isScalar(node)) return typeof node.value === 'string' ? 'a string' : node.value === null ? 'nothing' : `a ${typeof node.value}`;
  return 'a list';
}

function reportSyntax(ctx: Ctx, err: YAMLError, text: string, lines: LineCounter): void {
  const lineText = text.split('\n')[lines.linePos(err.pos[0]).line - 1] ?? '';
  const hint =
    err.code === 'TAB_AS_INDENT'
      ? 'Indent with spaces; YAML does not allow tabs for indentation.'
      : err.code === 'BAD_ALIAS' || /(^|[\s[{,:-])\*(\s|$|[\]},:])/.test(lineText)
        ? 'A bare * starts an alias in YAML: write the wildcard in quotes, "*".'
        : undefined;
  ctx.reportAt('GW_ERR_CONFIG_SYNTAX', '', err.pos[0], err.message.replace(/\s+/g, ' ').trim(), hint);
}

/** (kind, name) must be unique in a manifest; the later document is reported. */
function checkDuplicates(parsed: Parsed[], lines: LineCounter): void {
  const seen = new Map<string, number>();
  for (const p of parsed) {
    if (!p.resource) continue;
    const key = `${p.resource.kind}\u0000${p.resource.metadata.name}`;
    const first = seen.get(key);
    if (first === undefined) {
      seen.set(key, p.index);
      continue;
    }
    const pos = lines.linePos(p.nameOffset);
    const what = p.resource.kind === 'token' ? `token ${p.name}` : `${p.resource.kind} ${JSON.stringify(p.name)}`;
    p.issues.push({
      code: 'GW_ERR_RESOURCE_DUPLICATE',
      path: 'metadata.name',
      line: pos.line,
      column: pos.col,
      problem: `duplicate ${what} (first in document ${first})`,
      hint: 'Keep one definition of each resource in a manifest.',
    });
  }
}

function label(p: Parsed): string {
  if (p.kind === undefined || !isKind(p.kind)) return '';
  if (p.name === undefined) return ` (${p.kind})`;
  return p.kind === 'token' ? ` (token ${p.name})` : ` (${p.kind} ${JSON.stringify(p.name)})`;
}

function toError(parsed: Parsed[], source: string): GatewayError {
  const problems: ManifestProblem[] = [];
  for (const p of parsed) {
    const sorted = [...p.issues].sort((a, b) => a.line - b.line || a.column - b.column);
    for (const i of sorted) {
      problems.push({
        code: i.code,
        document: p.index,
        ...(p.kind === undefined ? {} : { kind: p.kind }),
        ...(p.name === undefined ? {} : { name: p.name }),
        path: i.path,
        line: i.line,
        column: i.column,
        message: `${source}: document ${p.index}${label(p)}: ${i.path === '' ? '' : `${i.path}: `}${i.problem} (line ${i.line}, column ${i.column})`,
        ...(i.hint === undefined ? {} : { hint: i.hint }),
      });
    }
  }
  const first = problems[0]!;
  let message = first.message;
  if (problems.length > 1) {
    const more = problems.slice(1, MAX_LISTED + 1).map((p) => `\n  ${p.message}`);
    const rest = problems.length - 1 - more.length;
    message += `\nand ${problems.length - 1} more problem${problems.length > 2 ? 's' : ''}:${more.join('')}${rest > 0 ? '\n  ...' : ''}`;
  }
  return new GatewayError('GW_ERR_RESOURCE_INVALID', message, {
    ...(first.hint === undefined ? {} : { hint: first.hint }),
    details: {
      source,
      document: first.document,
      kind: first.kind,
      ...(first.name === undefined ? {} : { name: first.name }),
      path: first.path,
      line: first.line,
      column: first.column,
      problems,
    },
  });
}

/** A copy without undefined members (optional fields that were not written). */
function clean(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(clean);
  if (typeof value === 'object' && value !== null) {
    // fromEntries defines own properties, so a label named __proto__ stays a plain key.
    return Object.fromEntries(
      Object.entries(value)
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [k, clean(v)]),
    );
  }
  return value;
}

// --- output ------------------------------------------------------------------------------------------------------

/**
 * A copy without secrets: spec.client_secret and spec.signing_key_pair.private_key removed, and a token's name
 * replaced by tokenId(token). `gwctl get` applies it unless --with-secrets is given. Not idempotent for tokens
 * (the id of an id is another id): apply it once, to resources that hold their secrets.
 */
export function withoutSecrets<R extends Resource>(resource: R): R {
  const copy = structuredClone(resource) as R;
  const spec = copy.spec as Record<string, unknown> | null | undefined;
  if (typeof spec === 'object' && spec !== null) {
    delete spec.client_secret;
    const pair = spec.signing_key_pair;
    if (typeof pair === 'object' && pair !== null) delete (pair as Record<string, unknown>).private_key;
  }
  if (copy.kind === 'token') copy.metadata.name = tokenId(copy.metadata.name);
  return copy;
}

/** kind, version, metadata, spec first, in that order (whatever order the object was built in). */
function ordered(r: Resource): Record<string, unknown> {
  const { kind, version, metadata, spec, ...rest } = r as Resource & Record<string, unknown>;
  return { kind, version, metadata, spec, ...rest };
}

/**
 * Resources as a YAML stream (documents separated by ---), as `gwctl get` prints them; '' for none. Strings that a
 * YAML 1.1 reader would take for something else (yes, on, 0755, 2030-01-01) are quoted, so that other tools read
 * the output as parseManifest does.
 */
export function toYaml(resources: readonly Resource[]): string {
  return resources.map((r) => stringify(ordered(r), { version: '1.1', lineWidth: 0 })).join('---\n');
}

/** Resources as a JSON array (two-space indentation, trailing newline), as `gwctl get --format json` prints them. */
export function toJson(resources: readonly Resource[]): string {
  return `${JSON.stringify(resources.map(ordered), null, 2)}\n`;
}

/**
 * Several manifests validated as one (gwctl apply -f DIR): every document of every file, then the same resource
 * (kind and name) in two files. One GW_ERR_RESOURCE_INVALID lists the problems of all files; nothing is returned
 * unless every document of every file validates.
 */
export function parseManifestFiles(files: ReadonlyArray<{ source: string; manifest: string }>): AnyResource[] {
  const problems: ManifestProblem[] = [];
  let firstSource: string | undefined;
  const all: AnyResource[] = [];
  const seen = new Map<string, string>();
  for (const file of files) {
    let resources: AnyResource[];
    try {
      resources = parseManifest(file.manifest, file.source);
    } catch (err) {
      if (!(err instanceof GatewayError) || err.code !== 'GW_ERR_RESOURCE_INVALID') throw err;
      const listed = (err.details.problems as ManifestProblem[] | undefined) ?? [];
      firstSource ??= file.source;
      problems.push(...(listed.length > 0 ? listed : [{ code: 'GW_ERR_RESOURCE_INVALID' as const, document: 1, path: '', line: 1, column: 1, message: err.message }]));
      continue;
    }
    for (const r of resources) {
      const key = `${r.kind}\u0000${r.metadata.name}`;
      const name = r.kind === 'token' ? tokenId(r.metadata.name) : r.metadata.name;
      const first = seen.get(key);
      if (first !== undefined) {
        firstSource ??= file.source;
        problems.push({
          code: 'GW_ERR_RESOURCE_DUPLICATE', document: 0, kind: r.kind, name, path: 'metadata.name', line: 0, column: 0,
          message: `${file.source}: ${r.kind} ${JSON.stringify(name)} is defined in ${first} too`, hint: 'Keep one definition of each resource across the files of an apply.',
        });
      } else {
        seen.set(key, file.source);
      }
      all.push(r);
    }
  }
  if (problems.length === 0) return all;
  const first = problems[0]!;
  const more = problems.slice(1, MAX_LISTED + 1).map((p) => `\n  ${p.message}`);
  const rest = problems.length - 1 - more.length;
  const message = `${first.message}${problems.length > 1 ? `\nand ${problems.length - 1} more problem${problems.length > 2 ? 's' : ''}:${more.join('')}${rest > 0 ? '\n  ...' : ''}` : ''}`;
  return fail(message, firstSource ?? '', first, problems);
}

function fail(message: string, source: string, first: ManifestProblem, problems: ManifestProblem[]): never {
  throw new GatewayError('GW_ERR_RESOURCE_INVALID', message, {
    ...(first.hint === undefined ? {} : { hint: first.hint }),
    details: { source, document: first.document, kind: first.kind, path: first.path, line: first.line, column: first.column, problems },
  });
}
