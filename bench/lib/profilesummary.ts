/**
 * A .cpuprofile (what `node --cpu-prof` writes) read into what bench/profile-summary.ts prints: the heaviest
 * self-time frames and a rollup by category, optionally clipped to a time window the bench wrote (profile times
 * and process.hrtime are the same monotonic clock, in µs), frames of a bundle put back at their source file and line
 * by a resolver (bench/profile-summary.ts reads the bundles' .map files). Pure: it takes the parsed JSON and the
 * resolver, never a path, and it is
 * bounded (a profile past MAX_NODES nodes or MAX_SAMPLES samples is refused, parent chains are walked at most
 * MAX_DEPTH frames, at most `top` frames and TOP_FILES files come out).
 */

export const MAX_NODES = 2_000_000;
export const MAX_SAMPLES = 20_000_000;
export const MAX_DEPTH = 4_000;
export const TOP_FILES = 15;

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
  columnNumber?: number;
}

/** Maps a bundled position (0-based line and column) to its source file and line, e.g. from the bundle's .map. */
export type Resolve = (url: string, line: number, column: number) => { url: string; line: number } | undefined;

interface Node_ {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}

/** The parts of a .cpuprofile this reads. */
export interface CpuProfile {
  nodes: Node_[];
  startTime: number;
  endTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** The categories of the rollup, in print order; "src/<file>" and "node_modules/<pkg>" rows follow them. */
export const CATEGORIES = [
  'idle',
  'garbage collector',
  'native outside JS ((program): TLS decryption on read, handshakes, libuv, V8)',
  'socket writes, native (TLS encryption + write(2))',
  'crypto and TLS, other native',
  'crypto and TLS, node JS (node:_tls_*, node:internal/crypto)',
  'stream plumbing (node:internal/streams)',
  'net and stream_base (node:net, node:internal/stream_base_commons)',
  'other node internals',
  'our code (src/)',
  'dependencies (node_modules)',
  'other',
] as const;
export type Category = (typeof CATEGORIES)[number];

const NATIVE_WRITES = new Set(['writev', 'writeBuffer', 'writeUtf8String', 'writeLatin1String', 'writeAsciiString']);
const NATIVE_CRYPTO = /^(sign|verify|Sign|Verify|Hash|Hmac|digest|update|final|ECDH|DiffieHellman|generateKeyPair\w*|createPrivateKey|createPublicKey|X509Certificate|setKey|setCert|setOCSPResponse|addCACert|addRootCerts|init|start|getPeerCertificate|getPeerX509Certificate|verifyError|getSession|setSession|pbkdf2|scrypt|randomBytes|timingSafeEqual|KeyObjectHandle|SecureContext|context|loadPKCS12|export|exportJwk|equals|checkPrivateKey|oneShotDigest|Cipheriv|Decipheriv)$/;

export interface Summary {
  /** µs of samples inside the window (idle included), and of busy ones (idle left out). */
  windowUs: number;
  busyUs: number;
  samples: number;
  /** via: the nearest frame of our code on the stack of most of that frame's time (a native write: who wrote). */
  top: Array<{ frame: string; us: number; share: number; via?: string }>;
  /** µs by category (shares are of busy time; idle's of the window). */
  categories: Array<{ category: Category; us: number; share: number }>;
  /** Our code by file (self time), heaviest first, at most TOP_FILES, the rest in one row. */
  ourFiles: Array<{ file: string; us: number; share: number }>;
}

/** Throws unless p looks like a .cpuprofile within the bounds. */
function check(p: unknown): asserts p is CpuProfile {
  const q = p as Partial<CpuProfile> | null;
  if (!q || !Array.isArray(q.nodes) || !Array.isArray(q.samples) || !Array.isArray(q.timeDeltas) || typeof q.startTime !== 'number') {
    throw new Error('not a .cpuprofile: nodes, samples, timeDeltas and startTime are needed');
  }
  if (q.nodes.length > MAX_NODES || q.samples.length > MAX_SAMPLES) throw new Error(`profile too large: ${q.nodes.length} nodes, ${q.samples.length} samples (at most ${MAX_NODES}, ${MAX_SAMPLES})`);
  if (q.samples.length !== q.timeDeltas.length) throw new Error(`profile damaged: ${q.samples.length} samples but ${q.timeDeltas.length} time deltas`);
}

/** Where a script's frames are counted: our src/ file (dist/x.js -> src/x.ts), a package, or node's own. */
export function sourceOf(url: string): { kind: 'ours' | 'dep' | 'node' | 'none' | 'other'; name: string } {
  if (!url) return { kind: 'none', name: '' };
  if (url.startsWith('node:')) return { kind: 'node', name: url.slice(5) };
  const nm = url.lastIndexOf('/node_modules/');
  if (nm >= 0) {
    const rest = url.slice(nm + 14).split('/');
    return { kind: 'dep', name: rest[0]!.startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]! };
  }
  const m = /(?:^|\/)(?:dist|src)\/(.+?)\.[cm]?[jt]s$/.exec(url);
  if (m) return { kind: 'ours', name: `src/${m[1]}.ts` };
  return { kind: 'other', name: url };
}

/** The category of one sample, by its leaf frame (and, for a native leaf, nothing more: the rollup is of self time). */
export function categoryOf(f: CallFrame): Category {
  const fn = f.functionName;
  if (fn === '(idle)') return 'idle';
  if (fn === '(garbage collector)') return 'garbage collector';
  if (fn === '(program)' || fn === '(root)') return CATEGORIES[2];
  const src = sourceOf(f.url);
  if (src.kind === 'none') {
    if (NATIVE_WRITES.has(fn)) return CATEGORIES[3];
    if (NATIVE_CRYPTO.test(fn)) return CATEGORIES[4];
    return 'other';
  }
  if (src.kind === 'node') {
    if (/^(_tls_|tls$|internal\/tls|internal\/crypto|crypto$)/.test(src.name)) return CATEGORIES[5];
    if (/^(internal\/streams\/|stream$)/.test(src.name)) return CATEGORIES[6];
    if (/^(net$|internal\/stream_base_commons|internal\/net)/.test(src.name)) return CATEGORIES[7];
    return CATEGORIES[8];
  }
  if (src.kind === 'ours') return 'our code (src/)';
  if (src.kind === 'dep') return 'dependencies (node_modules)';
  return 'other';
}

/** A frame's printed name: function (file:line), the file shortened as sourceOf does. */
function frameName(f: CallFrame): string {
  const src = sourceOf(f.url);
  const file = src.kind === 'none' ? '' : src.kind === 'other' ? src.name.slice(-60) : src.name;
  return `${f.functionName || '(anonymous)'}${file ? ` (${file}:${f.lineNumber + 1})` : ' (native)'}`;
}

/** The frame at its source position when resolve knows the bundle (our dist/ files have .map files), else as it is. */
function mapped(f: CallFrame, resolve: Resolve | undefined): CallFrame {
  if (!resolve || !f.url || f.url.startsWith('node:') || f.lineNumber < 0) return f;
  const to = resolve(f.url, f.lineNumber, f.columnNumber ?? 0);
  return to ? { ...f, url: to.url, lineNumber: to.line } : f;
}

/**
 * Self time per frame, per category and per file of ours, of the samples within [fromUs, toUs] (the whole profile
 * without a window). A sample's time is its time delta, as Chrome DevTools counts it.
 */
export function summarize(profile: unknown, opts: { fromUs?: number; toUs?: number; top?: number; resolve?: Resolve } = {}): Summary {
  check(profile);
  const top = Math.max(1, Math.min(opts.top ?? 15, 100));
  const byId = new Map<number, Node_>();
  const parent = new Map<number, number>();
  for (const n of profile.nodes) {
    byId.set(n.id, { ...n, callFrame: mapped(n.callFrame, opts.resolve) });
    for (const c of n.children ?? []) parent.set(c, n.id);
  }
  const ours = (id: number): string | undefined => {
    let c: number | undefined = id;
    for (let depth = 0; c !== undefined && depth < MAX_DEPTH; depth++, c = parent.get(c)) {
      const f = byId.get(c)?.callFrame;
      if (f && sourceOf(f.url).kind === 'ours') return frameName(f);
    }
    return undefined;
  };
  const self = new Map<number, number>();
  let t = profile.startTime;
  let windowUs = 0;
  let samples = 0;
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i]!;
    if ((opts.fromUs !== undefined && t < opts.fromUs) || (opts.toUs !== undefined && t > opts.toUs)) continue;
    const us = profile.timeDeltas[i + 1] ?? 0; // a sample stands for the time until the next one
    const id = profile.samples[i]!;
    if (!byId.has(id)) throw new Error(`profile damaged: sample ${i} names node ${id}, which is not in it`);
    self.set(id, (self.get(id) ?? 0) + us);
    windowUs += us;
    samples++;
  }
  const frames = new Map<string, number>();
  const via = new Map<string, Map<string, number>>();
  const cats = new Map<Category, number>(CATEGORIES.map((c) => [c, 0]));
  const files = new Map<string, number>();
  for (const [id, us] of self) {
    const f = byId.get(id)!.callFrame;
    const c = categoryOf(f);
    cats.set(c, cats.get(c)! + us);
    if (c === 'idle') continue;
    const name = frameName(f);
    frames.set(name, (frames.get(name) ?? 0) + us);
    const by = ours(id);
    if (by && by !== name) {
      const m = via.get(name) ?? new Map<string, number>();
      m.set(by, (m.get(by) ?? 0) + us);
      via.set(name, m);
    }
    const src = sourceOf(f.url);
    if (src.kind === 'ours') files.set(src.name, (files.get(src.name) ?? 0) + us);
  }
  const busyUs = windowUs - cats.get('idle')!;
  const share = (us: number) => (busyUs > 0 ? us / busyUs : 0);
  const sorted = [...files.entries()].sort((a, b) => b[1] - a[1]);
  const rest = sorted.slice(TOP_FILES).reduce((a, [, us]) => a + us, 0);
  return {
    windowUs,
    busyUs,
    samples,
    top: [...frames.entries()].sort((a, b) => b[1] - a[1]).slice(0, top).map(([frame, us]) => {
      const v = [...(via.get(frame) ?? new Map<string, number>()).entries()].sort((a, b) => b[1] - a[1])[0];
      return { frame, us, share: share(us), ...(v ? { via: `${v[0]} ${((v[1] / us) * 100).toFixed(0)}%` } : {}) };
    }),
    categories: CATEGORIES.map((category) => ({ category, us: cats.get(category)!, share: category === 'idle' ? (windowUs > 0 ? cats.get(category)! / windowUs : 0) : share(cats.get(category)!) })),
    ourFiles: [...sorted.slice(0, TOP_FILES).map(([file, us]) => ({ file, us, share: share(us) })), ...(rest > 0 ? [{ file: `(${sorted.length - TOP_FILES} other files)`, us: rest, share: share(rest) }] : [])],
  };
}

/**
 * Busy time of the sampled thread whose stack holds a frame of `file` (inclusive, each sample once), e.g. how much
 * of the native writes our relay starts. Walks at most MAX_DEPTH parents per sample node.
 */
export function inclusiveByOurFile(profile: unknown, opts: { fromUs?: number; toUs?: number; resolve?: Resolve } = {}): Map<string, number> {
  check(profile);
  const byId = new Map<number, Node_>();
  const parent = new Map<number, number>();
  for (const n of profile.nodes) {
    byId.set(n.id, { ...n, callFrame: mapped(n.callFrame, opts.resolve) });
    for (const c of n.children ?? []) parent.set(c, n.id);
  }
  const filesOf = new Map<number, Set<string>>();
  const files = (id: number) => {
    let got = filesOf.get(id);
    if (got) return got;
    got = new Set<string>();
    let c: number | undefined = id;
    for (let depth = 0; c !== undefined && depth < MAX_DEPTH; depth++, c = parent.get(c)) {
      const src = sourceOf(byId.get(c)?.callFrame.url ?? '');
      if (src.kind === 'ours') got.add(src.name);
    }
    filesOf.set(id, got);
    return got;
  };
  const out = new Map<string, number>();
  let t = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    t += profile.timeDeltas[i]!;
    if ((opts.fromUs !== undefined && t < opts.fromUs) || (opts.toUs !== undefined && t > opts.toUs)) continue;
    const id = profile.samples[i]!;
    if (byId.get(id)?.callFrame.functionName === '(idle)') continue;
    for (const f of files(id)) out.set(f, (out.get(f) ?? 0) + (profile.timeDeltas[i + 1] ?? 0));
  }
  return out;
}
