/**
 * The layers of src/, top to bottom. This table is the one place they are written down (docs/architecture.md
 * points here). A unit is a folder of src/ or a file at its top; every unit is in exactly one layer.
 *
 *   An import may go to its own unit, to another unit of the same layer, or to any lower layer; never up.
 *   The units must not import each other in a cycle (within a layer either), so each layer stays a DAG.
 *   Nor may the files: two files that import each other (directly or round a longer loop) are one module in two
 *   places; what both need goes into a small module of its own that both import.
 *
 * Imports are read with TypeScript's own scanner (static, `export … from`, `import type`, dynamic `import()`);
 * type-only imports count like the others: they tie the code together just the same.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const LAYERS: ReadonlyArray<{ layer: string; units: readonly string[]; why: string }> = [
  { layer: 'cli', units: ['cli'], why: 'the programs: argument parsing, output, exit codes' },
  { layer: 'daemon', units: ['daemon', 'roles', 'reload', 'handover'], why: 'one process running a set of roles: daemon.ts composes the role starters of roles/; pid file, locks and SIGHUP reload; the hand-over to a successor' },
  {
    layer: 'roles',
    units: ['auth', 'proxy', 'agent', 'client', 'upgrade'],
    why: 'what a process is for: the Auth Service, the Proxy, an agent (its end of the tunnel included), a client of the cluster (gwsh, gwctl, an agent joining), the upgraders',
  },
  { layer: 'services', units: ['config', 'backend'], why: 'what the roles stand on: the configuration and the storage' },
  {
    layer: 'transport',
    units: ['dial', 'mux', 'tunnel', 'net', 'stream', 'dbproto', 'wire'],
    why: 'bytes on the wire: dialing out, the one port, the tunnel protocol, listeners and deadlines, stream helpers, the database protocols read at startup (one parser per protocol: the agent enforces with it, the Proxy audits with it), and the contract both ends of an HTTP exchange share (wire: the ping and find answers, the version server, the forwarded headers, certificate bundles, and the protocol table: each protocol declared once), so that a client, an agent or an upgrader never imports a server file of the Proxy or the Auth Service',
  },
  { layer: 'leaves', units: ['errors', 'addr', 'log', 'paths', 'proc', 'fsutil', 'duration', 'redact', 'version', 'internals', 'backoff', 'format', 'metrics', 'trace'], why: 'small modules that import nothing above them (internals: the one file that reads private fields of other libraries, below every unit that needs one; backoff: the one retry timing; format: sizes and durations for the CLI and the Web UI alike; metrics: the one Prometheus registry every layer records into; trace: the one file that knows OpenTelemetry, whose hops every layer starts)' },
];

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const srcDir = join(root, 'src');

interface Edge {
  /** The importing unit and the imported one. */
  from: string;
  to: string;
  /** The importing file and the imported one, relative to the repository (src/auth/api.ts). */
  fromFile: string;
  toFile: string;
  /** file:line of the import, for the message. */
  where: string;
}

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return sourceFiles(path);
    return name.endsWith('.ts') ? [path] : [];
  });
}

/** The unit of a path under src/: its first folder, or the file's name without extension at the top. */
function unitOf(path: string): string {
  const first = relative(srcDir, path).split(sep)[0]!;
  return first.replace(/\.(ts|js)$/, '');
}

/** The source file an import names: './x.js' is ./x.ts, a folder is its index.ts. */
function sourceOf(target: string): string {
  const ts = target.replace(/\.js$/, '.ts');
  if (existsSync(ts) && statSync(ts).isFile()) return ts;
  if (existsSync(`${target}.ts`)) return `${target}.ts`;
  return join(target, 'index.ts');
}

/** Every relative import of every file in src/ as an edge between units (imports within a unit included) and files. */
function importEdges(): Edge[] {
  const edges: Edge[] = [];
  for (const file of sourceFiles(srcDir)) {
    const text = readFileSync(file, 'utf8');
    const info = ts.preProcessFile(text, true, true);
    for (const ref of info.importedFiles) {
      if (!ref.fileName.startsWith('.')) continue; // node: built-ins and packages
      const target = resolve(dirname(file), ref.fileName);
      const line = text.slice(0, ref.pos).split('\n').length;
      const [fromFile, toFile] = [relative(root, file), relative(root, sourceOf(target))];
      edges.push({ from: unitOf(file), to: unitOf(target), fromFile, toFile, where: `${fromFile}:${line} imports ${ref.fileName}` });
    }
  }
  return edges;
}

/** The same imports with the files as the nodes, for the cycle check between files. */
function fileGraph(edges: Edge[]): Edge[] {
  return edges.map((e) => ({ ...e, from: e.fromFile, to: e.toFile }));
}

/** Layer index per unit (0 = top); throws on a unit listed twice. */
function layerIndex(layers: typeof LAYERS): Map<string, number> {
  const index = new Map<string, number>();
  layers.forEach(({ units }, i) => {
    for (const unit of units) {
      if (index.has(unit)) throw new Error(`unit ${unit} is in two layers`);
      index.set(unit, i);
    }
  });
  return index;
}

/** Imports that go up a layer, or leave a unit the table does not place. */
function layerViolations(edges: Edge[], layers: typeof LAYERS): string[] {
  const index = layerIndex(layers);
  const out: string[] = [];
  for (const e of edges) {
    const from = index.get(e.from);
    const to = index.get(e.to);
    if (from === undefined || to === undefined) {
      out.push(`${e.where}: unit "${from === undefined ? e.from : e.to}" is in no layer (add it to LAYERS)`);
    } else if (to < from) {
      out.push(`${e.where}: ${e.from} (${layers[from]!.layer}) must not import ${e.to} (${layers[to]!.layer}, a higher layer)`);
    }
  }
  return out;
}

/** The units that are a client of a server of the cluster: an agent, gwsh and gwctl, the upgraders, the programs. */
const CLIENT_UNITS: ReadonlySet<string> = new Set(['agent', 'client', 'upgrade', 'cli']);
/** The servers' own files: every file of the Proxy, and the Auth Service's routers, facade and session store. */
const SERVER_FILES = /^src\/proxy\/|^src\/auth\/(api|ssoapi|proxyapi|agentapi|service|websessions)\.ts$/;

/** Imports of a server's file by a client: what both ends of a protocol share belongs in src/wire/. */
function clientServerImports(edges: Edge[]): string[] {
  return edges
    .filter((e) => CLIENT_UNITS.has(e.from) && SERVER_FILES.test(e.toFile))
    .map((e) => `${e.where}: ${e.from} is a client and must not import a server's file (${e.toFile}); move what both ends share to src/wire/`);
}

/** Every cycle among the nodes (units, or files: fileGraph), each as "a → b → … → a" with one import that closes each step. */
function cycles(edges: Edge[]): string[] {
  const graph = new Map<string, Map<string, string>>();
  for (const e of edges) {
    if (e.from === e.to) continue;
    if (!graph.has(e.from)) graph.set(e.from, new Map());
    if (!graph.get(e.from)!.has(e.to)) graph.get(e.from)!.set(e.to, e.where);
  }
  // Tarjan's strongly connected components: any component of more than one unit holds a cycle.
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const components: string[][] = [];
  const visit = (v: string): void => {
    index.set(v, counter);
    low.set(v, counter++);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v)?.keys() ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) === index.get(v)) {
      const component: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) components.push(component.sort());
    }
  };
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v);
  return components.map((units) => {
    const members = new Set(units);
    const imports = units.flatMap((u) => [...(graph.get(u) ?? [])].filter(([to]) => members.has(to)).map(([to, where]) => `${u} → ${to} (${where})`));
    return `cycle among ${units.join(', ')}: ${imports.join('; ')}`;
  });
}

describe('architecture', () => {
  const edges = importEdges();

  it('reads the imports of src/ (the scanner works)', () => {
    expect(edges.length).toBeGreaterThan(100);
    expect(edges.some((e) => e.from === 'cli' && e.to === 'daemon')).toBe(true);
  });

  it('places every unit of src/ in exactly one layer', () => {
    const index = layerIndex(LAYERS);
    const units = new Set(sourceFiles(srcDir).map(unitOf));
    expect([...units].filter((u) => !index.has(u)).sort()).toEqual([]);
    expect([...index.keys()].filter((u) => !units.has(u)).sort()).toEqual([]);
  });

  it('imports only from the same layer or below', () => {
    expect(layerViolations(edges, LAYERS)).toEqual([]);
  });

  it('has no cycle among the units', () => {
    expect(cycles(edges)).toEqual([]);
  });

  it('a client imports no server file: both ends import the contract from src/wire/', () => {
    expect(clientServerImports(edges)).toEqual([]);
  });

  it('has no cycle among the files', () => {
    const files = fileGraph(edges);
    expect(files.every((e) => existsSync(join(root, e.to))), 'every import resolves to a file').toBe(true);
    expect(cycles(files)).toEqual([]);
  });

  it('the checks find what they are for', () => {
    const e = (from: string, to: string): Edge => ({ from, to, fromFile: `src/${from}.ts`, toFile: `src/${to}.ts`, where: `${from}.ts:1` });
    expect(layerViolations([e('errors', 'cli')], LAYERS)).toEqual(['errors.ts:1: errors (leaves) must not import cli (cli, a higher layer)']);
    expect(layerViolations([e('cli', 'errors'), e('proxy', 'auth')], LAYERS)).toEqual([]);
    expect(layerViolations([e('cli', 'nowhere')], LAYERS)).toHaveLength(1);
    expect(cycles([e('a', 'b'), e('b', 'c'), e('c', 'a'), e('c', 'd')])).toEqual(['cycle among a, b, c: a → b (a.ts:1); b → c (b.ts:1); c → a (c.ts:1)']);
    expect(cycles([e('a', 'b'), e('b', 'c'), e('a', 'c'), e('a', 'a')])).toEqual([]);
    // Two files of one unit that import each other: no cycle among the units, one among the files, with its imports.
    const f = (fromFile: string, toFile: string, line: number): Edge => ({
      from: unitOf(join(root, fromFile)),
      to: unitOf(join(root, toFile)),
      fromFile,
      toFile,
      where: `${fromFile}:${line} imports ./${toFile.split('/').pop()!.replace(/\.ts$/, '.js')}`,
    });
    const planted = [f('src/auth/api.ts', 'src/auth/ssoapi.ts', 44), f('src/auth/ssoapi.ts', 'src/auth/api.ts', 19), f('src/auth/api.ts', 'src/errors.ts', 3)];
    expect(cycles(planted)).toEqual([]);
    expect(cycles(fileGraph(planted))).toEqual([
      'cycle among src/auth/api.ts, src/auth/ssoapi.ts: src/auth/api.ts → src/auth/ssoapi.ts (src/auth/api.ts:44 imports ./ssoapi.js); src/auth/ssoapi.ts → src/auth/api.ts (src/auth/ssoapi.ts:19 imports ./api.js)',
    ]);
    expect(clientServerImports([f('src/agent/tunnel.ts', 'src/proxy/ping.ts', 40)])).toEqual([
      "src/agent/tunnel.ts:40 imports ./ping.js: agent is a client and must not import a server's file (src/proxy/ping.ts); move what both ends share to src/wire/",
    ]);
    expect(clientServerImports([f('src/agent/tunnel.ts', 'src/wire/ping.ts', 40), f('src/proxy/frontdoor.ts', 'src/proxy/ping.ts', 40), f('src/client/api.ts', 'src/auth/pki.ts', 11)])).toEqual([]);
    expect(() => layerIndex([...LAYERS, { layer: 'again', units: ['cli'], why: '' }])).toThrow(/two layers/);
  });
});

// --- private fields of other libraries -----------------------------------------------------------------------------

/** The one file that may read them (it says, per field, why and what happens without it). */
const INTERNALS_FILE = 'src/internals.ts';
/** Node's stream methods that an implementation defines and may call on super: public API despite the underscore. */
const STREAM_IMPLEMENTER_METHODS = new Set(['_read', '_write', '_writev', '_final', '_destroy', '_construct', '_transform', '_flush']);

/**
 * Every place in text that names a field starting with `_` (a library's private field, by the JavaScript
 * convention): a property or element access (`x._sock`, `x['_sock']`), an `in` test (`'_parent' in x`), a key of a
 * type (`as { _handle?: ... }`, an interface) or of an object literal (`{ _protocol: ... }`, a fake of one).
 * Parameter and variable names (`_id`) and the keys of destructuring (`{ by: _by }` names `by`) are not fields.
 */
function privateFieldReads(text: string, file: string): string[] {
  const source = ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS);
  const out: string[] = [];
  const hit = (node: ts.Node, name: string, what: string) => {
    if (!name.startsWith('_') || STREAM_IMPLEMENTER_METHODS.has(name)) return;
    const line = source.getLineAndCharacterOfPosition(node.getStart(source)).line + 1;
    out.push(`${file}:${line}: ${what} ${name}`);
  };
  const keyName = (name: ts.PropertyName): string | undefined => (ts.isIdentifier(name) || ts.isStringLiteral(name) || ts.isPrivateIdentifier(name) ? name.text : undefined);
  const visit = (node: ts.Node): void => {
    if (ts.isPropertyAccessExpression(node) && ts.isIdentifier(node.name)) hit(node, node.name.text, 'reads');
    else if (ts.isElementAccessExpression(node) && ts.isStringLiteralLike(node.argumentExpression)) hit(node, node.argumentExpression.text, 'reads');
    else if (ts.isBinaryExpression(node) && node.operatorToken.kind === ts.SyntaxKind.InKeyword && ts.isStringLiteralLike(node.left)) hit(node, node.left.text, 'tests for');
    else if ((ts.isPropertySignature(node) || ts.isPropertyAssignment(node)) && keyName(node.name) !== undefined) hit(node, keyName(node.name)!, 'declares the key');
    else if (ts.isShorthandPropertyAssignment(node)) hit(node, node.name.text, 'declares the key');
    ts.forEachChild(node, visit);
  };
  visit(source);
  return out;
}

describe("other libraries' private fields", () => {
  it(`are read only in ${INTERNALS_FILE}`, () => {
    const reads = sourceFiles(srcDir)
      .map((path) => relative(root, path).split(sep).join('/'))
      .filter((file) => file !== INTERNALS_FILE)
      .flatMap((file) => privateFieldReads(readFileSync(join(root, file), 'utf8'), file));
    expect(reads).toEqual([]);
  });

  it('the check finds each form, and leaves names that are not fields alone', () => {
    const planted = [
      'const a = (conn as unknown as { _sock?: Duplex })._sock;',
      "const b = socket['_parent'];",
      "if ('_handle' in socket) go();",
      'new SFTP({ _protocol: protocol });',
      'const c = { _remoteIdentRaw };',
      'interface Fake { _socket?: unknown }',
    ].join('\n');
    expect(privateFieldReads(planted, 'x.ts')).toEqual([
      'x.ts:1: reads _sock',
      'x.ts:1: declares the key _sock',
      'x.ts:2: reads _parent',
      'x.ts:3: tests for _handle',
      'x.ts:4: declares the key _protocol',
      'x.ts:5: declares the key _remoteIdentRaw',
      'x.ts:6: declares the key _socket',
    ]);
    const innocent = [
      'function f(_id: number, _opts: unknown) { const _unused = 1; }',
      'const { by: _by, ...rest } = event;',
      'class S extends Writable { override _write(c: Buffer, _e: string, cb: () => void) { super._write(c, _e, cb); } }',
      "const d = { id_: x.id_, 'a_b': y.value };",
    ].join('\n');
    expect(privateFieldReads(innocent, 'y.ts')).toEqual([]);
  });
});

/*
 * No function in src/ or bench/ is over 100 lines (the house rule): a long function is split into named steps (a
 * bench's main is the order of its phases, each phase a function). Every function-like node is read with
 * TypeScript's own parser, so methods, arrows and closures count alike.
 */
const ROOT = `${root}/`;
const MAX_LINES = 100;

function tsFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? tsFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []));
}

/** Every function-like node with a body of more than max lines, as "file:line name (N lines)". */
function longFunctions(path: string, text: string, max: number): string[] {
  const sf = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true);
  const out: string[] = [];
  const visit = (node: ts.Node): void => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const start = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line;
      const end = sf.getLineAndCharacterOfPosition(node.end).line;
      const lines = end - start + 1;
      const name = node.name && ts.isIdentifier(node.name) ? node.name.text : '(anonymous)';
      if (lines > max) out.push(`${path.slice(ROOT.length)}:${start + 1} ${name} (${lines} lines)`);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

describe('function length', () => {
  it('finds a long function, an arrow and a method alike (so that it cannot pass by finding nothing)', () => {
    const body = Array.from({ length: 101 }, (_, i) => `  x += ${i};`).join('\n');
    const text = `function a() {\n${body}\n}\nconst b = () => {\n${body}\n};\nclass C { m() {\n${body}\n} }\nfunction short() { return 1; }\n`;
    expect(longFunctions(join(ROOT, 'x.ts'), text, MAX_LINES).map((s) => s.split(' ')[1])).toEqual(['a', '(anonymous)', 'm']);
  });

  for (const dir of ['src', 'bench']) {
    it(`no function in ${dir}/ is over ${MAX_LINES} lines`, () => {
      const found = tsFiles(join(ROOT, dir));
      expect(found.length).toBeGreaterThan(0);
      const long = found.flatMap((f) => longFunctions(f, readFileSync(f, 'utf8'), MAX_LINES));
      expect(long).toEqual([]);
    });
  }
});
