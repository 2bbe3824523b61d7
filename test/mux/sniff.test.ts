import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { HTTP_METHODS, PROXY_V2_SIGNATURE, SNIFF_MAX_BYTES, sniffProtocol } from '../../src/mux/sniff.js';

const b = (s: string) => Buffer.from(s, 'latin1');

describe('sniffProtocol', () => {
  const complete: Array<[string, Buffer, string]> = [
    ['TLS 1.0 record', Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]), 'tls'],
    ['TLS record 0x0300', Buffer.from([0x16, 0x03, 0x00]), 'tls'],
    ['TLS record 0x0303', Buffer.from([0x16, 0x03, 0x03]), 'tls'],
    ['TLS record 0x0304', Buffer.from([0x16, 0x03, 0x04]), 'tls'],
    ['SSH banner', b('SSH-2.0-OpenSSH_9.2\r\n'), 'ssh'],
    ['PROXY v1', b('PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n'), 'proxy-v1'],
    ['PROXY v2', Buffer.concat([PROXY_V2_SIGNATURE, Buffer.from([0x21, 0x11, 0, 12])]), 'proxy-v2'],
    ['bare PROXY v2 signature', PROXY_V2_SIGNATURE, 'proxy-v2'],
    ...HTTP_METHODS.map((m): [string, Buffer, string] => [`HTTP ${m}`, b(`${m} / HTTP/1.1\r\n`), 'http']),
    ['HTTP method and space only', b('GET '), 'http'],
    ["an agent's data connection", b('GWDATA1 0123456789abcdef 1 '), 'gwdata'],
    ["a client's end-to-end stream line", b('GWE2E1 eyJ2IjoxfQ.c2ln\n'), 'gwe2e'],
  ];
  it.each(complete)('%s → %s', (_name, buf, kind) => {
    expect(sniffProtocol(buf)).toEqual({ kind });
    // Fed byte by byte, the first answer that is not need-more is already the right one.
    let firstDecided = 0;
    while (sniffProtocol(buf.subarray(0, firstDecided)).kind === 'need-more') firstDecided++;
    expect(sniffProtocol(buf.subarray(0, firstDecided))).toEqual({ kind });
  });

  it.each([
    ['empty', ''],
    ['0x16', '\x16'],
    ['0x16 0x03', '\x16\x03'],
    ['S', 'S'],
    ['SSH', 'SSH'],
    ['P (POST, PUT, PATCH, PROXY)', 'P'],
    ['PRO', 'PRO'],
    ['PROXY', 'PROXY'],
    ['GW (GWDATA1, GWE2E1)', 'GW'],
    ['GWE2E1 without its space', 'GWE2E1'],
    ['G', 'G'],
    ['OPTIONS', 'OPTIONS'],
    ['CONNEC', 'CONNEC'],
    ['CR', '\r'],
    ['11 bytes of the v2 signature', PROXY_V2_SIGNATURE.subarray(0, 11).toString('latin1')],
  ])('%s → need-more', (_name, text) => {
    expect(sniffProtocol(b(text))).toEqual({ kind: 'need-more' });
  });

  it.each([
    ['a NUL byte', '\x00'],
    ['an alert record', '\x15\x03\x01'],
    ['SSLv2-compatible hello', '\x80\x2e\x01'],
    ['lowercase method', 'get / HTTP/1.1'],
    ['method without space', 'GET/'],
    ['method followed by a tab', 'GET\t/'],
    ['TLS with record version 0x0305', '\x16\x03\x05'],
    ['TLS with record version 0x0201', '\x16\x02\x01'],
    ['SSH lowercase', 'ssh-2.0'],
    ['PROXY without space', 'PROXY\r\n'],
    ['GWE2E2 (another version of the line)', 'GWE2E2 '],
    ['PROXY lowercase', 'proxy TCP4'],
    ['almost the v2 signature', '\r\n\r\n\x00\r\nQUIT\r'],
    ['HTTP/2 preface', 'PRI * HTTP/2.0\r\n'],
    ['an HTTP response', 'HTTP/1.1 200 OK'],
    ['a letter that starts nothing', 'X'],
  ])('%s → unknown', (_name, text) => {
    expect(sniffProtocol(b(text))).toEqual({ kind: 'unknown' });
  });

  it('says unknown after one byte for every byte that starts no pattern', () => {
    const starters = new Set([0x16, ...'SPGHDOCT\r'].map((c) => (typeof c === 'number' ? c : c.charCodeAt(0))));
    for (let byte = 0; byte < 256; byte++) {
      const r = sniffProtocol(Buffer.from([byte]));
      expect(r.kind).toBe(starters.has(byte) ? 'need-more' : 'unknown');
    }
  });

  it('never needs more than SNIFF_MAX_BYTES (12) bytes', () => {
    expect(SNIFF_MAX_BYTES).toBe(12);
  });

  it('property: decisions are final and need-more only happens on short prefixes', () => {
    const prefixes = [
      Buffer.from([0x16, 0x03]),
      b('SSH-'),
      b('PROXY '),
      PROXY_V2_SIGNATURE,
      ...HTTP_METHODS.map((m) => b(`${m} `)),
    ];
    const input = fc.oneof(
      fc.uint8Array({ maxLength: 40 }).map((a) => Buffer.from(a)),
      fc
        .tuple(fc.constantFrom(...prefixes), fc.nat(14), fc.uint8Array({ maxLength: 20 }))
        .map(([p, cut, tail]) => Buffer.concat([p.subarray(0, cut), Buffer.from(tail)])),
    );
    fc.assert(
      fc.property(input, fc.uint8Array({ maxLength: 20 }), (buf, more) => {
        const r = sniffProtocol(buf);
        if (r.kind === 'need-more') {
          expect(buf.length).toBeLessThan(SNIFF_MAX_BYTES);
        } else {
          expect(sniffProtocol(Buffer.concat([buf, Buffer.from(more)]))).toEqual(r);
        }
      }),
      { numRuns: 2000 },
    );
  });
});
