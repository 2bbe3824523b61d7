import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { parseConfig, sampleConfig } from '../../src/config/index.js';
import { referenceRows } from '../../src/config/sample.js';
import { GatewayError } from '../../src/errors.js';

/** parseConfig either returns a frozen config or throws a configuration GatewayError with a position. */
function checkParse(text: string): void {
  let config: unknown;
  try {
    config = parseConfig(text, 'fuzz.yaml');
  } catch (err) {
    if (!(err instanceof GatewayError)) throw err;
    expect(err.code).toMatch(/^GW_ERR_CONFIG_/);
    expect(typeof err.details.path).toBe('string');
    expect(Number.isInteger(err.details.line) && (err.details.line as number) >= 1).toBe(true);
    expect(Number.isInteger(err.details.column) && (err.details.column as number) >= 1).toBe(true);
    expect(err.message.startsWith('fuzz.yaml:')).toBe(true);
    return;
  }
  expect(Object.isFrozen(config)).toBe(true);
}

const rows = referenceRows();
const keys = [...new Set(rows.flatMap((r) => r.path.split('.')))].filter((k) => !k.startsWith('<'));
const sections = [...new Set(rows.map((r) => r.path.split('.')[0]!))];

/** Values that look like what people write in this file, and some that do not. */
const scalar = fc.oneof(
  fc.constantFrom('yes', 'no', 'true', 'Off', ':3025', '[::1]:443', '0.0.0.0:0', 'v17.0.1', 'v1', 'https://u.example.com/x', 'stable/v14', '', '~'),
  fc.string({ maxLength: 12 }),
  fc.integer(),
  fc.double(),
  fc.boolean(),
  fc.constant(null),
);
const value: fc.Arbitrary<unknown> = fc.letrec((tie) => ({
  node: fc.oneof({ depthSize: 'small', withCrossShrink: true }, scalar, tie('list'), tie('map')),
  list: fc.array(tie('node'), { maxLength: 4 }),
  map: fc.dictionary(fc.oneof(fc.constantFrom(...keys, 'static_version', 'forward_url', 'default', 'stable/v14'), fc.string({ maxLength: 6 })), tie('node'), {
    maxKeys: 5,
  }),
})).node;
const configLike = fc.dictionary(fc.constantFrom(...sections, 'bogus'), value, { maxKeys: 5 });

describe('parseConfig never throws anything but a configuration GatewayError', () => {
  it('on arbitrary strings', () => {
    fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 200 }), checkParse), { numRuns: 300 });
  });

  it('on strings made of YAML punctuation', () => {
    const chars = fc.constantFrom(...'abc:- \n\t[]{}&*!|>\'"%@`#,?~0123.v/'.split(''));
    fc.assert(fc.property(fc.string({ unit: chars, maxLength: 80 }), checkParse), { numRuns: 500 });
  });

  it('on arbitrary YAML documents', () => {
    fc.assert(fc.property(fc.anything(), (v) => checkParse(stringify(v) ?? '')), { numRuns: 200 });
  });

  it('on documents shaped like the configuration', () => {
    fc.assert(fc.property(configLike, (v) => checkParse(stringify(v))), { numRuns: 500 });
  });

  it('on the sample with random edits', () => {
    const sample = sampleConfig();
    const edit = fc.tuple(fc.nat(sample.length), fc.nat(8), fc.string({ maxLength: 6 }));
    fc.assert(
      fc.property(fc.array(edit, { minLength: 1, maxLength: 4 }), (edits) => {
        let text = sample;
        for (const [at, drop, insert] of edits) text = text.slice(0, at) + insert + text.slice(at + drop);
        checkParse(text);
      }),
      { numRuns: 300 },
    );
  });

  it('on aliases that refer to their own ancestors', () => {
    checkParse('proxy_service: &p\n  automatic_upgrades_channels: *p\n');
    checkParse('gateway: &g\n  log: *g\n');
    checkParse('a: &x [*x]\nproxy_service:\n  public_addr: *x\n');
  });
});
