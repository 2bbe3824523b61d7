/**
 * The layers of src/, top to bottom. This table is the one place they are written down (docs/architecture.md
 * points here). A unit is a folder of src/ or a file at its top; every unit is in exactly one layer.
 *
 *   An import may go to its own unit, to another unit of the same layer, or to any lower layer; never up.
 *   The units must not import each other in a cycle (within a layer either), so each layer stays a DAG.
 *
 * Imports are read with TypeScript's own scanner (static, `export … from`, `import type`, dynamic `import()`);
 * type-only imports count like the others: they tie the code together just the same.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const LAYERS: ReadonlyArray<{ layer: string; units: readonly string[]; why: string }> = [
  { layer: 'cli', units: ['cli'], why: 'the programs: argument parsing, output, exit codes' },
  { layer: 'daemon', units: ['daemon', 'roles', 'reload'], why: 'one process running a set of roles: daemon.ts composes the role starters of roles/; pid file, locks and SIGHUP reload' },
  {
    layer: 'roles',
    units: ['auth', 'proxy', 'agent', 'client', 'upgrade'],
    why: 'what a process is for: the Auth Service, the Proxy, an agent (its end of the tunnel included), a client of the cluster (gwsh, gwctl, an agent joining), the upgraders',
  },
  { layer: 'services', units: ['config', 'backend'], why: 'what the roles stand on: the configuration and the storage' },
  {
    layer: 'transport',
    units: ['dial', 'mux', 'tunnel', 'net', 'stream', 'dbproto'],
    why: 'bytes on the wire: dialing out, the one port, the tunnel protocol, listeners and deadlines, stream helpers, the database protocols read at startup (one parser per protocol: the agent enforces with it, the Proxy audits with it)',
  },
  { layer: 'leaves', units: ['errors', 'addr', 'log', 'paths', 'proc', 'fsutil', 'duration', 'redact', 'version', 'format'], why: 'small modules that import nothing above them' },
];

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const srcDir = join(root, 'src');

interface Edge {
  from: string;
  to: string;
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

/** Every relative import of every file in src/ as an edge between units (imports within a unit included). */
function importEdges(): Edge[] {
  const edges: Edge[] = [];
  for (const file of sourceFiles(srcDir)) {
    const text = readFileSync(file, 'utf8');
    const info = ts.preProcessFile(text, true, true);
    for (const ref of info.importedFiles) {
      if (!ref.fileName.startsWith('.')) continue; // node: built-ins and packages
      const target = resolve(dirname(file), ref.fileName);
      const line = text.slice(0, ref.pos).split('\n').length;
      edges.push({ from: unitOf(file), to: unitOf(target), where: `${relative(root, file)}:${line} imports ${ref.fileName}` });
    }
  }
  return edges;
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

/** Every cycle among units, each as "a → b → … → a" with one import that closes each step. */
function unitCycles(edges: Edge[]): string[] {
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
    expect(unitCycles(edges)).toEqual([]);
  });

  it('the checks find what they are for', () => {
    const e = (from: string, to: string): Edge => ({ from, to, where: `${from}.ts:1` });
    expect(layerViolations([e('errors', 'cli')], LAYERS)).toEqual(['errors.ts:1: errors (leaves) must not import cli (cli, a higher layer)']);
    expect(layerViolations([e('cli', 'errors'), e('proxy', 'auth')], LAYERS)).toEqual([]);
    expect(layerViolations([e('cli', 'nowhere')], LAYERS)).toHaveLength(1);
    expect(unitCycles([e('a', 'b'), e('b', 'c'), e('c', 'a'), e('c', 'd')])).toEqual(['cycle among a, b, c: a → b (a.ts:1); b → c (b.ts:1); c → a (c.ts:1)']);
    expect(unitCycles([e('a', 'b'), e('b', 'c'), e('a', 'c'), e('a', 'a')])).toEqual([]);
    expect(() => layerIndex([...LAYERS, { layer: 'again', units: ['cli'], why: '' }])).toThrow(/two layers/);
  });
});
