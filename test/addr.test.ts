/**
 * The one address parser (src/addr.ts): what is an IP literal, an RFC 1123 host name and a port, as a table and
 * as properties over generated addresses and their mutations.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { AddrError, MAX_ADDR_LENGTH, isDnsName, parseAddr, parseHost } from '../src/addr.js';

/** The longest host name: three 63-character labels and one of 61, 253 characters in all. */
const NAME_253 = [...Array(3).fill('a'.repeat(63)), 'b'.repeat(61)].join('.');

function problem(text: string): AddrError | undefined {
  try {
    parseAddr(text);
    return undefined;
  } catch (err) {
    if (err instanceof AddrError) return err;
    throw err;
  }
}

describe('parseAddr accepts', () => {
  it.each([
    ['10.0.0.1', { host: '10.0.0.1', port: undefined }],
    ['0.0.0.0:443', { host: '0.0.0.0', port: 443 }],
    ['255.255.255.255:65535', { host: '255.255.255.255', port: 65535 }],
    ['2001:db8::1', { host: '2001:db8::1', port: undefined }],
    ['[2001:DB8::1]:443', { host: '2001:db8::1', port: 443 }],
    ['[::ffff:10.0.0.1]', { host: '::ffff:10.0.0.1', port: undefined }],
    ['[fe80::1%eth0]:22', { host: 'fe80::1%eth0', port: 22 }],
    ['localhost:3080', { host: 'localhost', port: 3080 }],
    ['kube.e2e-cluster.local:443', { host: 'kube.e2e-cluster.local', port: 443 }],
    ['Proxy.Example.COM.:443', { host: 'proxy.example.com', port: 443 }],
    ['1password.example.com', { host: '1password.example.com', port: undefined }],
    ['a-b.c-d.example', { host: 'a-b.c-d.example', port: undefined }],
    ['x'.repeat(63) + '.example.com:1', { host: 'x'.repeat(63) + '.example.com', port: 1 }],
    [NAME_253, { host: NAME_253, port: undefined }],
    ['example.com.:443', { host: 'example.com', port: 443 }],
    ['host123:443', { host: 'host123', port: 443 }],
  ])('%s', (text, want) => {
    expect(parseAddr(text)).toEqual(want);
  });

  it('an empty host only with allowEmptyHost, port 0 only with allowPortZero', () => {
    expect(parseAddr(':3025', { allowEmptyHost: true })).toEqual({ host: '', port: 3025 });
    expect(parseAddr('127.0.0.1:0', { allowPortZero: true })).toEqual({ host: '127.0.0.1', port: 0 });
    expect(problem(':3025')?.message).toContain('no host');
    expect(problem('127.0.0.1:0')?.message).toContain('outside 1-65535');
  });
});

describe('parseAddr refuses, saying why', () => {
  it.each([
    ['10.0.0.256', 'over 255'],
    ['999.999.999.999:443', 'over 255'],
    ['300.1.1.1', 'over 255'],
    ['1.2.3', 'not the four of an IPv4 address'],
    ['1.2.3.4.5:80', 'not the four of an IPv4 address'],
    ['1234', 'not the four of an IPv4 address'],
    ['010.0.0.1', 'leading zero'],
    ['10..0.1', 'empty part'],
    ['foo.123', 'all-numeric label'],
    ['foo_bar.example.com', 'contains "_"'],
    ['_srv.example.com:443', 'contains "_"'],
    ['-foo.example.com', 'starts or ends with "-"'],
    ['foo-.example.com', 'starts or ends with "-"'],
    ['a..b.example.com', 'empty label'],
    ['.example.com', 'empty label'],
    [`${'x'.repeat(64)}.example.com`, 'label of 64 characters'],
    [`${NAME_253}b`, 'more than 253'],
    ['exa mple.com', 'contains " "'],
    ['münchen.example', 'contains "ü"'],
    ['host:0', 'outside 1-65535'],
    ['host:65536', 'outside 1-65535'],
    ['host:', 'not a number'],
    ['host:http', 'not a number'],
    ['host:-1', 'not a number'],
    ['2001:db8::1:443:x', 'not an IPv6 address'],
    ['2001:db8::zz', 'not an IPv6 address'],
    ['[example.com]:443', 'in brackets is not an IPv6 address'],
    ['[2001:db8::1', 'without closing it'],
    ['[2001:db8::1]443', 'after "]"'],
    ['[fe80::1%a b]:22', 'in brackets is not an IPv6 address'],
    ['', 'empty'],
    ['x'.repeat(MAX_ADDR_LENGTH + 1), `longer than ${MAX_ADDR_LENGTH}`],
  ])('%s', (text, why) => {
    const err = problem(text);
    expect(err).toBeInstanceOf(AddrError);
    expect(err!.message).toContain(why);
  });

  it('gives a hint with the fix for the commonest mistakes', () => {
    expect(problem('foo_bar.example.com')!.hint).toContain('Replace "_" with "-"');
    expect(problem('10.0.0.256')!.hint).toContain('four numbers from 0 to 255');
    expect(problem('host:99999')!.hint).toContain('1 to 65535');
    expect(problem('2001:db8::1:443:x')!.hint).toContain('[2001:db8::1]:443');
  });

  it.each([
    ['https://gw.example.com', 'gw.example.com:443'],
    ['https://gw.example.com:8443/web/', 'gw.example.com:8443'],
    ['HTTP://user:secret@gw.example.com', 'gw.example.com:80'],
    ['https://[2001:db8::1]', '[2001:db8::1]:443'],
    ['tcp://10.0.0.5:3025', '10.0.0.5:3025'],
  ])('a URL (%s) is told to drop the scheme, and what the hint says to write parses', (url, instead) => {
    const err = problem(url)!;
    expect(err.message).toMatch(/^a URL \(\w+:\/\/\.\.\.\) where host:port is expected$/);
    expect(err.hint).toBe(`Drop the scheme: write host:port, here ${instead}.`);
    expect(err.hint).not.toMatch(/IPv6|bracket/);
    expect(`${err.message} ${err.hint}`).not.toContain('secret');
    expect(() => parseAddr(instead)).not.toThrow();
  });
});

describe('host names matched as text', () => {
  it('accept "_" only when asked (NO_PROXY entries, names in issued certificates)', () => {
    expect(isDnsName('kube.my_cluster.local')).toBe(false);
    expect(isDnsName('kube.my_cluster.local', { allowUnderscore: true })).toBe(true);
    expect(parseHost('my_host', { allowUnderscore: true })).toBe('my_host');
  });

  it('an IPv4 literal is not a host name', () => {
    expect(isDnsName('10.0.0.1')).toBe(false);
    expect(isDnsName('10.0.0.256')).toBe(false);
  });
});

// --- properties ----------------------------------------------------------------------------------------------------

const octet = fc.integer({ min: 0, max: 255 });
const ipv4 = fc.tuple(octet, octet, octet, octet).map((o) => o.join('.'));
const label = fc.stringMatching(/^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/);
const tld = fc.stringMatching(/^[a-z]([a-z0-9-]{0,20}[a-z0-9])?$/);
const hostName = fc
  .tuple(fc.array(label, { minLength: 0, maxLength: 3 }), tld)
  .map(([labels, last]) => [...labels, last].join('.'))
  .filter((n) => n.length <= 253);
const port = fc.integer({ min: 1, max: 65535 });

/** A valid address text and the host and port parseAddr must give. */
const validAddr = fc.oneof(
  fc.tuple(ipv4, fc.option(port, { nil: undefined })).map(([h, p]) => ({ text: p === undefined ? h : `${h}:${p}`, host: h, port: p })),
  fc.tuple(fc.ipV6(), fc.option(port, { nil: undefined })).map(([h, p]) => ({ text: p === undefined ? h : `[${h}]:${p}`, host: h, port: p })),
  fc.tuple(hostName, fc.option(port, { nil: undefined })).map(([h, p]) => ({ text: p === undefined ? h : `${h}:${p}`, host: h, port: p })),
);

describe('properties', () => {
  it('every generated IPv4, IPv6 and RFC 1123 address is accepted, with its port', () => {
    fc.assert(
      fc.property(validAddr, ({ text, host, port: p }) => {
        const a = parseAddr(text);
        expect(a.port).toBe(p);
        if (!host.includes(':')) expect(a.host).toBe(host.toLowerCase());
      }),
      { numRuns: 500 },
    );
  });

  it('an IPv4 address with one octet out of range is refused', () => {
    fc.assert(
      fc.property(ipv4, fc.integer({ min: 0, max: 3 }), fc.integer({ min: 256, max: 99999 }), fc.option(port, { nil: undefined }), (ip, i, bad, p) => {
        const parts = ip.split('.');
        parts[i] = String(bad);
        const text = parts.join('.');
        const err = problem(p === undefined ? text : `${text}:${p}`);
        expect(err?.message).toContain('over 255');
      }),
    );
  });

  it('dotted numbers with other than four parts are refused', () => {
    fc.assert(
      fc.property(fc.array(octet, { minLength: 1, maxLength: 8 }).filter((a) => a.length !== 4), (parts) => {
        expect(problem(parts.join('.'))).toBeInstanceOf(AddrError);
      }),
    );
  });

  it('a host name with "_" put anywhere in it is refused', () => {
    fc.assert(
      fc.property(hostName, fc.nat(), fc.option(port, { nil: undefined }), (name, at, p) => {
        const i = at % (name.length + 1);
        const mutated = `${name.slice(0, i)}_${name.slice(i)}`;
        const err = problem(p === undefined ? mutated : `${mutated}:${p}`);
        expect(err).toBeInstanceOf(AddrError);
      }),
    );
  });

  it('never throws anything but AddrError, and stays within its bound, on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 400 }), (text) => {
        try {
          const a = parseAddr(text);
          expect(text.length).toBeLessThanOrEqual(MAX_ADDR_LENGTH);
          expect(a.host.length).toBeLessThanOrEqual(253 + 2);
        } catch (err) {
          expect(err).toBeInstanceOf(AddrError);
        }
      }),
      { numRuns: 1000 },
    );
  });
});
