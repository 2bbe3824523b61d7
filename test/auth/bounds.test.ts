/** The scans that run on a request body before a parser: they bound nesting, never under-count it. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { jsonDepth, yamlNestingBound } from '../../src/auth/bounds.js';

type Tree = null | number | string | Tree[] | { [k: string]: Tree };
function depthOf(v: Tree): number {
  if (Array.isArray(v)) return 1 + Math.max(0, ...v.map(depthOf));
  if (v !== null && typeof v === 'object') return 1 + Math.max(0, ...Object.values(v).map(depthOf));
  return 0;
}
const tree = fc.letrec<{ t: Tree }>((tie) => ({
  t: fc.oneof({ depthSize: 'small', withCrossShrink: true }, fc.constant(null), fc.integer(), fc.string({ maxLength: 8 }), fc.array(tie('t'), { maxLength: 3 }), fc.dictionary(fc.string({ minLength: 1, maxLength: 4 }), tie('t'), { maxKeys: 3 })),
})).t;

describe('jsonDepth', () => {
  it('is the nesting of [ and { outside strings', () => {
    expect(jsonDepth('{}', 10)).toBe(1);
    expect(jsonDepth('{"a":[1,{"b":[]}]}', 10)).toBe(4);
    expect(jsonDepth('"[[[[[["', 10)).toBe(0);
    expect(jsonDepth('"\\"[[[["', 10)).toBe(0);
    expect(jsonDepth('[1, "]]]]", [2]]', 10)).toBe(2);
  });
  it('stops as soon as it is over the limit (a hostile 1 MiB of [ costs one pass at most)', () => {
    expect(jsonDepth('['.repeat(1024 * 1024), 32)).toBe(33);
  });
  it('equals the real depth of any JSON value', () => {
    fc.assert(fc.property(tree, (t) => jsonDepth(JSON.stringify(t), 1000) === depthOf(t)), { numRuns: 500 });
  });
});

describe('yamlNestingBound', () => {
  it('counts indentation, block indicators on one line, and open flow brackets', () => {
    expect(yamlNestingBound('kind: role\nspec:\n  allow:\n    rules: []\n', 100)).toBe(5);
    expect(yamlNestingBound('- - - - x\n', 100)).toBe(8);
    expect(yamlNestingBound('a: [[[[1]]]]\n', 100)).toBe(4);
    expect(yamlNestingBound('a: "x" # [[[[[\n', 100)).toBe(0);
  });
  it('stops as soon as it is over the limit', () => {
    expect(yamlNestingBound('- '.repeat(500_000), 96)).toBeGreaterThan(96);
    expect(yamlNestingBound(`${'['.repeat(500_000)}`, 96)).toBeGreaterThan(96);
  });
  it('never under-counts: the bound of a YAML document is at least its depth, block or flow style', () => {
    fc.assert(
      fc.property(tree, fc.boolean(), (t, flow) => {
        const text = stringify({ root: t }, flow ? { collectionStyle: 'flow' } : {});
        return yamlNestingBound(text, 10_000) >= depthOf({ root: t }) - 1;
      }),
      { numRuns: 500 },
    );
  });
});
