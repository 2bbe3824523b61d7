/**
 * No function in src/ or bench/ is over 100 lines (the house rule): a long function is split into named steps (a
 * bench's main is the order of its phases, each phase a function). The test reads every function-like node with
 * TypeScript's own parser, so methods, arrows and closures count alike.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const ROOT = new URL('../', import.meta.url).pathname;
const MAX_LINES = 100;

function files(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? files(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : []));
}

/** Every function-like node with a body of more than max lines, as "file:line name (N lines)". */
export function longFunctions(path: string, text: string, max: number): string[] {
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
      const found = files(join(ROOT, dir));
      expect(found.length).toBeGreaterThan(0);
      const long = found.flatMap((f) => longFunctions(f, readFileSync(f, 'utf8'), MAX_LINES));
      expect(long).toEqual([]);
    });
  }
});
