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

describe('addresses in the configuration', () => {
  const octet = fc.integer({ min: 0, max: 255 });
  const ipv4 = fc.tuple(octet, octet, octet, octet).map((o) => o.join('.'));
  const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?$/);
  const name = fc.tuple(fc.array(label, { maxLength: 3 }), fc.stringMatching(/^[a-z]([a-z0-9-]{0,10}[a-z0-9])?$/)).map(([l, tld]) => [...l, tld].join('.'));
  const withPort = (host: fc.Arbitrary<string>) => fc.tuple(host, fc.option(fc.integer({ min: 1, max: 65535 }), { nil: undefined })).map(([h, p]) => (p === undefined ? h : `${h}:${p}`));
  const yaml = (addr: string) => `proxy_service:\n  public_addr: ["${addr}"]\nssh_service:\n  listen_addr: "${addr.includes(':') ? addr : `${addr}:3022`}"\n`;

  it('generated IPv4 addresses and RFC 1123 names, with or without a port, are accepted as public_addr and listen_addr', () => {
    fc.assert(
      fc.property(withPort(fc.oneof(ipv4, name)), (addr) => {
        const config = parseConfig(yaml(addr), 'gen.yaml');
        expect(config.proxy_service.public_addr[0]!.host).toBe(addr.replace(/:\d+$/, ''));
      }),
    );
  });

  it('the same addresses with an octet over 255 or a "_" are refused with GW_ERR_CONFIG_ADDR at the key', () => {
    const badOctet = fc.tuple(ipv4, fc.integer({ min: 0, max: 3 }), fc.integer({ min: 256, max: 999 })).map(([ip, i, n]) => ip.split('.').map((o, j) => (j === i ? String(n) : o)).join('.'));
    const underscore = fc.tuple(name, fc.nat()).map(([n, at]) => `${n.slice(0, at % (n.length + 1))}_${n.slice(at % (n.length + 1))}`);
    fc.assert(
      fc.property(withPort(fc.oneof(badOctet, underscore)), (addr) => {
        let err: unknown;
        try {
          parseConfig(yaml(addr), 'gen.yaml');
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(GatewayError);
        expect((err as GatewayError).code).toBe('GW_ERR_CONFIG_ADDR');
        expect((err as GatewayError).details).toMatchObject({ path: 'proxy_service.public_addr[0]', line: 2, column: 17 });
      }),
    );
  });
});
