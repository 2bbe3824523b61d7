import net from 'node:net';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { GatewayError } from '../../src/errors.js';
import {
  PP2_TYPE,
  PROXY_V2_SIGNATURE,
  buildProxyHeaderV1,
  buildProxyHeaderV2,
  crc32c,
  formatIP,
  parseIPv4,
  parseIPv6,
  parseProxyHeader,
  type ProxyHeaderResult,
} from '../../src/mux/proxyproto.js';

const b = (s: string) => Buffer.from(s, 'latin1');
const hex = (s: string) => Buffer.from(s.replace(/\s+/g, ''), 'hex');
const SIG = PROXY_V2_SIGNATURE.toString('hex');

function errorOf(f: () => unknown): GatewayError {
  try {
    f();
  } catch (err) {
    if (err instanceof GatewayError) return err;
    throw err;
  }
  throw new Error('expected a GatewayError, got a result');
}
const codeOf = (buf: Buffer) => errorOf(() => parseProxyHeader(buf)).code;

/** Feeds buf one byte at a time: need-more for every strict prefix, then the answer for the whole. */
function byteByByte(buf: Buffer): ProxyHeaderResult {
  for (let n = 0; n < buf.length; n++) {
    expect(parseProxyHeader(buf.subarray(0, n)), `prefix of ${n} bytes`).toEqual({ kind: 'need-more' });
  }
  return parseProxyHeader(buf);
}

// ---- v1 -------------------------------------------------------------------------------------------------------

describe('PROXY v1', () => {
  const ffff6 = 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff';
  const vectors: Array<[string, string, object]> = [
    [
      'the spec example before an HTTP request',
      'PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n',
      { family: 'tcp4', source: { address: '192.168.0.1', port: 56324 }, destination: { address: '192.168.0.11', port: 443 } },
    ],
    [
      'the spec\'s longest TCP4 line (56 bytes)',
      'PROXY TCP4 255.255.255.255 255.255.255.255 65535 65535\r\n',
      { family: 'tcp4', source: { address: '255.255.255.255', port: 65535 }, destination: { address: '255.255.255.255', port: 65535 } },
    ],
    [
      'the spec\'s longest TCP6 line (104 bytes)',
      `PROXY TCP6 ${ffff6} ${ffff6} 65535 65535\r\n`,
      { family: 'tcp6', source: { address: ffff6, port: 65535 }, destination: { address: ffff6, port: 65535 } },
    ],
    ['the spec\'s short UNKNOWN line (15 bytes)', 'PROXY UNKNOWN\r\n', { family: 'unknown' }],
    ['the spec\'s worst case UNKNOWN line (107 bytes)', `PROXY UNKNOWN ${ffff6} ${ffff6} 65535 65535\r\n`, { family: 'unknown' }],
    ['UNKNOWN with anything printable after it', 'PROXY UNKNOWN what ever  \r\n', { family: 'unknown' }],
    [
      'port 0 and address 0.0.0.0',
      'PROXY TCP4 0.0.0.0 10.0.0.1 0 22\r\n',
      { family: 'tcp4', source: { address: '0.0.0.0', port: 0 }, destination: { address: '10.0.0.1', port: 22 } },
    ],
    [
      'compressed, upper-case and IPv4-mapped IPv6 (returned as Node prints them)',
      'PROXY TCP6 2001:DB8:0:0:0:0:0:1 ::FFFF:192.0.2.7 40000 3080\r\n',
      { family: 'tcp6', source: { address: '2001:db8::1', port: 40000 }, destination: { address: '::ffff:192.0.2.7', port: 3080 } },
    ],
  ];

  it.each(vectors)('%s', (_name, line, expected) => {
    const buf = b(line);
    expect(buf.length).toBeLessThanOrEqual(107);
    const r = parseProxyHeader(Buffer.concat([buf, b('GET / HTTP/1.1\r\nHost: x\r\n\r\n')]));
    expect(r).toEqual({ kind: 'header', version: 1, length: buf.length, command: 'PROXY', ...expected });
    expect(byteByByte(buf)).toEqual(r);
  });

  it('spec line lengths', () => {
    expect(b(vectors[1]![1]).length).toBe(56);
    expect(b(vectors[2]![1]).length).toBe(104);
    expect(b(vectors[3]![1]).length).toBe(15);
    expect(b(vectors[4]![1]).length).toBe(107);
  });

  const bad: Array<[string, string]> = [
    ['lower-case keyword', 'proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n'],
    ['unknown protocol', 'PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n'],
    ['UDP4', 'PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n'],
    ['UNKNOWN glued to more letters', 'PROXY UNKNOWNX\r\n'],
    ['two spaces', 'PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n'],
    ['a trailing space', 'PROXY TCP4 1.2.3.4 5.6.7.8 1 2 \r\n'],
    ['a missing port', 'PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n'],
    ['an extra field', 'PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n'],
    ['a tab instead of a space', 'PROXY TCP4\t1.2.3.4 5.6.7.8 1 2\r\n'],
    ['LF without CR', 'PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n'],
    ['a bare CR inside', 'PROXY TCP4 1.2.3.4\r5.6.7.8 1 2\r\n'],
    ['CR CR LF', 'PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\r\n'],
    ['an octet with a leading zero', 'PROXY TCP4 192.168.0.01 5.6.7.8 1 2\r\n'],
    ['an octet above 255', 'PROXY TCP4 256.1.1.1 5.6.7.8 1 2\r\n'],
    ['three octets', 'PROXY TCP4 1.2.3 5.6.7.8 1 2\r\n'],
    ['an IPv6 source in TCP4', 'PROXY TCP4 ::1 5.6.7.8 1 2\r\n'],
    ['an IPv4 destination in TCP6', 'PROXY TCP6 ::1 5.6.7.8 1 2\r\n'],
    ['an IPv6 zone', 'PROXY TCP6 fe80::1%eth0 ::1 1 2\r\n'],
    ['a bracketed IPv6', 'PROXY TCP6 [::1] ::1 1 2\r\n'],
    ['two double colons', 'PROXY TCP6 1::2::3 ::1 1 2\r\n'],
    ['nine IPv6 groups', 'PROXY TCP6 1:2:3:4:5:6:7:8:9 ::1 1 2\r\n'],
    ['a 5-digit IPv6 group', 'PROXY TCP6 12345::1 ::1 1 2\r\n'],
    ['a host name', 'PROXY TCP4 example.com 5.6.7.8 1 2\r\n'],
    ['a port with a leading zero', 'PROXY TCP4 1.2.3.4 5.6.7.8 0443 2\r\n'],
    ['port 00', 'PROXY TCP4 1.2.3.4 5.6.7.8 00 2\r\n'],
    ['port 65536', 'PROXY TCP4 1.2.3.4 5.6.7.8 1 65536\r\n'],
    ['a negative port', 'PROXY TCP4 1.2.3.4 5.6.7.8 -1 2\r\n'],
    ['a signed port', 'PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n'],
    ['a hexadecimal port', 'PROXY TCP4 1.2.3.4 5.6.7.8 0x10 2\r\n'],
    ['a non-printable byte in an UNKNOWN line', 'PROXY UNKNOWN \x01\r\n'],
    ['a UTF-8 byte', 'PROXY UNKNOWN \xc3\xa9\r\n'],
    ['no CRLF within 107 bytes', `PROXY UNKNOWN ${'a'.repeat(100)}\r\n`],
    ['HTTP instead of PROXY', 'POST / HTTP/1.1\r\n'],
  ];

  it.each(bad)('refuses %s', (_name, line) => {
    const err = errorOf(() => parseProxyHeader(b(line)));
    expect(err.code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(err.message).toMatch(/^bad PROXY protocol header: /);
  });

  it.each(bad)('%s, fed byte by byte: need-more, then an error, never a header', (_name, line) => {
    const buf = b(line);
    let n = 0;
    for (; n <= buf.length; n++) {
      let r: ProxyHeaderResult;
      try {
        r = parseProxyHeader(buf.subarray(0, n));
      } catch (err) {
        expect((err as GatewayError).code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
        break;
      }
      expect(r).toEqual({ kind: 'need-more' });
    }
    expect(n).toBeLessThanOrEqual(buf.length);
  });

  it('refuses early: a wrong keyword or protocol at its first byte, an over-long line at byte 107', () => {
    expect(codeOf(b('PROXY X'))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(codeOf(b('PROXY TCP4\x00'))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(codeOf(b('PX'))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    const long = b(`PROXY UNKNOWN ${'a'.repeat(200)}`);
    expect(parseProxyHeader(long.subarray(0, 106))).toEqual({ kind: 'need-more' });
    expect(codeOf(long.subarray(0, 107))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
  });

  it('builds v1 headers', () => {
    expect(buildProxyHeaderV1({ family: 'unknown' }).toString()).toBe('PROXY UNKNOWN\r\n');
    expect(
      buildProxyHeaderV1({
        family: 'tcp4',
        source: { address: '192.168.0.1', port: 56324 },
        destination: { address: '192.168.0.11', port: 443 },
      }).toString(),
    ).toBe('PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n');
    expect(
      buildProxyHeaderV1({
        family: 'tcp6',
        source: { address: '2001:DB8:0::1', port: 1 },
        destination: { address: '::1', port: 2 },
      }).toString(),
    ).toBe('PROXY TCP6 2001:db8::1 ::1 1 2\r\n');
  });

  it.each([
    ['a missing source', { family: 'tcp4' as const, destination: { address: '1.2.3.4', port: 1 } }],
    ['an IPv6 address for tcp4', { family: 'tcp4' as const, source: { address: '::1', port: 1 }, destination: { address: '1.2.3.4', port: 1 } }],
    ['a port above 65535', { family: 'tcp4' as const, source: { address: '1.2.3.4', port: 70000 }, destination: { address: '1.2.3.4', port: 1 } }],
    ['a fractional port', { family: 'tcp4' as const, source: { address: '1.2.3.4', port: 1.5 }, destination: { address: '1.2.3.4', port: 1 } }],
  ])('refuses to build a v1 header with %s', (_name, options) => {
    expect(errorOf(() => buildProxyHeaderV1(options)).code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
  });
});

// ---- v2 -------------------------------------------------------------------------------------------------------

describe('PROXY v2', () => {
  const tcp4 = hex(`${SIG} 21 11 000c  c0a80001 c0a8000b dc04 01bb`);
  const tcp6 = hex(`${SIG} 21 21 0024  20010db8000000000000000000000001 20010db8000000000000000000000002 3039 01bb`);
  const tlvBlock = hex(
    `01 0002 6832` + // ALPN "h2"
      `02 000b ${b('example.com').toString('hex')}` + // AUTHORITY
      `04 0003 000000` + // NOOP
      `ea 0009 01${b('vpce-abc').toString('hex')}` + // a custom type (the value AWS uses for VPC endpoints)
      `20 0015 07 00000000 21 0007 ${b('TLSv1.3').toString('hex')} 22 0003 ${b('bob').toString('hex')}`, // SSL
  );
  const tcp4Tlvs = Buffer.concat([hex(`${SIG} 21 11`), Buffer.from([0, 12 + tlvBlock.length]), tcp4.subarray(16), tlvBlock]);

  const vectors: Array<[string, Buffer, object]> = [
    [
      'TCP over IPv4',
      tcp4,
      {
        command: 'PROXY',
        family: 'tcp4',
        source: { address: '192.168.0.1', port: 56324 },
        destination: { address: '192.168.0.11', port: 443 },
        tlvs: [],
      },
    ],
    [
      'TCP over IPv6',
      tcp6,
      {
        command: 'PROXY',
        family: 'tcp6',
        source: { address: '2001:db8::1', port: 12345 },
        destination: { address: '2001:db8::2', port: 443 },
        tlvs: [],
      },
    ],
    [
      'TCP over IPv4 with TLVs (ALPN, AUTHORITY, NOOP, custom, SSL)',
      tcp4Tlvs,
      {
        command: 'PROXY',
        family: 'tcp4',
        source: { address: '192.168.0.1', port: 56324 },
        destination: { address: '192.168.0.11', port: 443 },
        tlvs: [
          { type: PP2_TYPE.ALPN, value: b('h2') },
          { type: PP2_TYPE.AUTHORITY, value: b('example.com') },
          { type: PP2_TYPE.NOOP, value: Buffer.alloc(3) },
          { type: 0xea, value: b('\x01vpce-abc') },
          { type: PP2_TYPE.SSL, value: hex(`07 00000000 21 0007 ${b('TLSv1.3').toString('hex')} 22 0003 ${b('bob').toString('hex')}`) },
        ],
      },
    ],
    ['LOCAL (a health check)', hex(`${SIG} 20 00 0000`), { command: 'LOCAL', family: 'unknown' }],
    ['LOCAL with an address block, which is skipped', hex(`${SIG} 20 11 000c c0a80001 c0a8000b dc04 01bb`), { command: 'LOCAL', family: 'unknown' }],
    ['LOCAL with an undefined family byte, which is ignored', hex(`${SIG} 20 55 0003 ffffff`), { command: 'LOCAL', family: 'unknown' }],
    ['PROXY with UNSPEC: use the real endpoints', hex(`${SIG} 21 00 0000`), { command: 'PROXY', family: 'unknown' }],
    ['PROXY with UNSPEC and a block, which is ignored', hex(`${SIG} 21 00 0004 01020304`), { command: 'PROXY', family: 'unknown' }],
    [
      'PROXY over a UNIX stream socket: accepted as unknown',
      Buffer.concat([hex(`${SIG} 21 31 00d8`), Buffer.alloc(216, 0x2f)]),
      { command: 'PROXY', family: 'unknown' },
    ],
  ];

  it.each(vectors)('%s', (_name, buf, expected) => {
    const withData = Buffer.concat([buf, b('\x16\x03\x01 and then the TLS stream')]);
    const r = parseProxyHeader(withData);
    expect(r).toEqual({ kind: 'header', version: 2, length: buf.length, ...expected });
    expect(byteByByte(buf)).toEqual(r);
  });

  const bad: Array<[string, Buffer]> = [
    ['version 1 in the binary header', hex(`${SIG} 11 11 000c c0a80001 c0a8000b dc04 01bb`)],
    ['version 3', hex(`${SIG} 31 11 000c c0a80001 c0a8000b dc04 01bb`)],
    ['command 2', hex(`${SIG} 22 11 000c c0a80001 c0a8000b dc04 01bb`)],
    ['command 0xf', hex(`${SIG} 2f 00 0000`)],
    ['UDP over IPv4', hex(`${SIG} 21 12 000c c0a80001 c0a8000b dc04 01bb`)],
    ['UDP over IPv6', hex(`${SIG} 21 22 0024 ${'00'.repeat(36)}`)],
    ['a UNIX datagram socket', hex(`${SIG} 21 32 00d8 ${'00'.repeat(216)}`)],
    ['family 4', hex(`${SIG} 21 41 000c ${'00'.repeat(12)}`)],
    ['transport 3', hex(`${SIG} 21 13 000c ${'00'.repeat(12)}`)],
    ['AF_INET with an unspecified transport', hex(`${SIG} 21 10 000c ${'00'.repeat(12)}`)],
    ['an IPv4 block shorter than the addresses', hex(`${SIG} 21 11 000b c0a80001 c0a8000b dc04 01`)],
    ['an IPv6 block shorter than the addresses', hex(`${SIG} 21 21 0023 ${'00'.repeat(35)}`)],
    ['a length above the 4096 limit', hex(`${SIG} 21 11 1001`)],
    ['the largest length', hex(`${SIG} 21 11 ffff`)],
    ['a truncated TLV header', hex(`${SIG} 21 11 000e c0a80001 c0a8000b dc04 01bb 0100`)],
    ['a TLV that runs past the block', hex(`${SIG} 21 11 0012 c0a80001 c0a8000b dc04 01bb 01 0005 683268`)],
    ['a TLV of 64 KiB in a small block', hex(`${SIG} 21 11 0010 c0a80001 c0a8000b dc04 01bb 01 ffff 00`)],
    ['a CRC32C TLV of 3 bytes', hex(`${SIG} 21 11 0012 c0a80001 c0a8000b dc04 01bb 03 0003 000000`)],
    ['a wrong CRC32C', hex(`${SIG} 21 11 0013 c0a80001 c0a8000b dc04 01bb 03 0004 00000000`)],
    ['a UNIQUE_ID of 129 bytes', hex(`${SIG} 21 11 0090 c0a80001 c0a8000b dc04 01bb 05 0081 ${'ab'.repeat(129)}`)],
    ['an SSL TLV shorter than 5 bytes', hex(`${SIG} 21 11 0013 c0a80001 c0a8000b dc04 01bb 20 0004 01000000`)],
    ['an SSL sub-TLV that runs past the SSL TLV', hex(`${SIG} 21 11 0017 c0a80001 c0a8000b dc04 01bb 20 0008 01 00000000 21 0009`)],
    ['a wrong signature', hex(`0d0a0d0a000d0a51554954 0b 21 11 0000`)],
  ];

  it.each(bad)('refuses %s', (_name, buf) => {
    expect(codeOf(buf)).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
  });

  it.each(bad)('%s, fed byte by byte: need-more, then an error, never a header', (_name, buf) => {
    let n = 0;
    for (; n <= buf.length; n++) {
      let r: ProxyHeaderResult;
      try {
        r = parseProxyHeader(buf.subarray(0, n));
      } catch (err) {
        expect((err as GatewayError).code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
        break;
      }
      expect(r).toEqual({ kind: 'need-more' });
    }
    expect(n).toBeLessThanOrEqual(buf.length);
  });

  it('refuses early: a bad version at byte 13, a datagram family at byte 14, an over-long length at byte 16', () => {
    expect(codeOf(hex(`${SIG} 11`))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(codeOf(hex(`${SIG} 21 12`))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(codeOf(hex(`${SIG} 21 11 1001`))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(codeOf(hex('0d0a0d0a01'))).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
  });

  it('maxV2Length raises or lowers the bound', () => {
    const big = buildProxyHeaderV2({
      family: 'tcp4',
      source: { address: '1.2.3.4', port: 1 },
      destination: { address: '5.6.7.8', port: 2 },
      tlvs: [{ type: 0xe0, value: Buffer.alloc(5000) }],
    });
    expect(codeOf(big)).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
    expect(parseProxyHeader(big, { maxV2Length: 0xffff })).toMatchObject({ kind: 'header', length: big.length });
    expect(() => parseProxyHeader(tcp4, { maxV2Length: 11 })).toThrow(GatewayError);
  });

  it('CRC32C: the RFC 4960 check value, and a header built with a checksum verifies', () => {
    expect(crc32c(b('123456789'))).toBe(0xe3069283);
    const buf = buildProxyHeaderV2({
      family: 'tcp6',
      source: { address: '2001:db8::1', port: 5000 },
      destination: { address: '2001:db8::2', port: 443 },
      tlvs: [{ type: PP2_TYPE.AUTHORITY, value: b('gateway.example.com') }],
      crc32c: true,
    });
    const r = parseProxyHeader(buf);
    if (r.kind !== 'header') throw new Error('expected a header');
    expect(r.tlvs!.map((t) => t.type)).toEqual([PP2_TYPE.AUTHORITY, PP2_TYPE.CRC32C]);
    for (const at of [0x0d, 20, buf.length - 20, buf.length - 1]) {
      const flipped = Buffer.from(buf);
      flipped[at]! ^= 0x01;
      expect(() => parseProxyHeader(flipped)).toThrow(GatewayError);
    }
  });

  it('builds the vectors above byte for byte', () => {
    expect(
      buildProxyHeaderV2({ family: 'tcp4', source: { address: '192.168.0.1', port: 56324 }, destination: { address: '192.168.0.11', port: 443 } }),
    ).toEqual(tcp4);
    expect(
      buildProxyHeaderV2({ family: 'tcp6', source: { address: '2001:db8::1', port: 12345 }, destination: { address: '2001:db8::2', port: 443 } }),
    ).toEqual(tcp6);
    expect(buildProxyHeaderV2({ command: 'LOCAL' })).toEqual(hex(`${SIG} 20 00 0000`));
    expect(buildProxyHeaderV2({})).toEqual(hex(`${SIG} 21 00 0000`));
  });

  it.each([
    ['LOCAL with addresses', { command: 'LOCAL' as const, family: 'tcp4' as const, source: { address: '1.2.3.4', port: 1 }, destination: { address: '1.2.3.4', port: 1 } }],
    ['tcp6 without a destination', { family: 'tcp6' as const, source: { address: '::1', port: 1 } }],
    ['a TLV type above 255', { tlvs: [{ type: 256, value: Buffer.alloc(0) }] }],
    ['a TLV of 64 KiB', { tlvs: [{ type: 0xe0, value: Buffer.alloc(65536) }] }],
    ['TLVs over 64 KiB in all', { tlvs: [{ type: 0xe0, value: Buffer.alloc(40000) }, { type: 0xe1, value: Buffer.alloc(40000) }] }],
    ['crc32c and a CRC32C TLV', { crc32c: true, tlvs: [{ type: PP2_TYPE.CRC32C, value: Buffer.alloc(4) }] }],
  ])('refuses to build a v2 header with %s', (_name, options) => {
    expect(errorOf(() => buildProxyHeaderV2(options)).code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
  });
});

// ---- addresses --------------------------------------------------------------------------------------------------

describe('IP address text', () => {
  it.each([
    ['2001:0db8:0000:0000:0001:0000:0000:0001', '2001:db8::1:0:0:1'],
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'],
    ['0:0:0:0:0:0:0:0', '::'],
    ['::1', '::1'],
    ['1::', '1::'],
    ['1:0:0:2:0:0:0:3', '1:0:0:2::3'],
    ['::ffff:10.0.0.1', '::ffff:10.0.0.1'],
    ['::ffff:a00:1', '::ffff:10.0.0.1'],
    ['::10.0.0.1', '::10.0.0.1'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4:5:6:102:304'],
  ])('%s → %s', (text, canonical) => {
    expect(formatIP(parseIPv6(text)!)).toBe(canonical);
  });

  it.each(['', ':', ':::', '1:2', '1::2::3', 'g::1', '::1%lo', '[::1]', '1.2.3.4', '::1.2.3', '::01.2.3.4', '1:2:3:4:5:6:7:1.2.3.4'])(
    'refuses IPv6 %j',
    (text) => {
      expect(parseIPv6(text)).toBeNull();
    },
  );

  it.each(['', '1.2.3', '1.2.3.4.5', '01.2.3.4', '1.2.3.256', ' 1.2.3.4', '1.2.3.4 ', '0x1.2.3.4'])('refuses IPv4 %j', (text) => {
    expect(parseIPv4(text)).toBeNull();
  });

  it('property: IPv6 text parses like Node, and formats exactly as Node prints addresses', () => {
    fc.assert(
      fc.property(fc.ipV6(), (text) => {
        const bytes = parseIPv6(text);
        expect(bytes).not.toBeNull();
        expect(formatIP(bytes!)).toBe(new net.SocketAddress({ address: text, family: 'ipv6' }).address);
        expect(parseIPv6(formatIP(bytes!))).toEqual(bytes);
      }),
      { numRuns: 1000 },
    );
  });

  it('property: 16 random bytes format as Node prints them', () => {
    fc.assert(
      fc.property(
        fc.uint8Array({ minLength: 16, maxLength: 16 }),
        fc.array(fc.nat(15), { maxLength: 14 }),
        (raw, zeros) => {
          const bytes = Buffer.from(raw);
          for (const z of zeros) bytes[z] = 0; // make zero runs likely
          const text = formatIP(bytes);
          expect(parseIPv6(text)).toEqual(bytes);
          expect(new net.SocketAddress({ address: text, family: 'ipv6' }).address).toBe(text);
        },
      ),
      { numRuns: 1000 },
    );
  });

  it('property: anything parseIPv6 / parseIPv4 accept, Node accepts too', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[0-9a-fA-F:.]{0,45}$/), (text) => {
        if (parseIPv6(text) !== null) expect(net.isIPv6(text)).toBe(true);
        if (parseIPv4(text) !== null) expect(net.isIPv4(text)).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });
});

// ---- round trips and arbitrary input ----------------------------------------------------------------------------

const port = fc.integer({ min: 0, max: 65535 });
const endpoints = fc.oneof(
  fc.record({ family: fc.constant('tcp4' as const), source: fc.record({ address: fc.ipV4(), port }), destination: fc.record({ address: fc.ipV4(), port }) }),
  fc.record({ family: fc.constant('tcp6' as const), source: fc.record({ address: fc.ipV6(), port }), destination: fc.record({ address: fc.ipV6(), port }) }),
);
const canonical = (family: 'tcp4' | 'tcp6', a: { address: string; port: number }) => ({
  address: formatIP(family === 'tcp4' ? parseIPv4(a.address)! : parseIPv6(a.address)!),
  port: a.port,
});

describe('build → parse round trips', () => {
  it('property: v1', () => {
    fc.assert(
      fc.property(fc.oneof(endpoints, fc.constant({ family: 'unknown' as const })), fc.uint8Array({ maxLength: 20 }), (e, tail) => {
        const buf = buildProxyHeaderV1(e);
        expect(buf.length).toBeLessThanOrEqual(107);
        const r = parseProxyHeader(Buffer.concat([buf, Buffer.from(tail)]));
        if (e.family === 'unknown') {
          expect(r).toEqual({ kind: 'header', version: 1, length: buf.length, command: 'PROXY', family: 'unknown' });
        } else {
          expect(r).toEqual({
            kind: 'header',
            version: 1,
            length: buf.length,
            command: 'PROXY',
            family: e.family,
            source: canonical(e.family, e.source),
            destination: canonical(e.family, e.destination),
          });
        }
        const cut = buf.length === 0 ? 0 : tail.length % buf.length;
        expect(parseProxyHeader(buf.subarray(0, cut))).toEqual({ kind: 'need-more' });
      }),
      { numRuns: 1000 },
    );
  });

  it('property: v2 with TLVs and optional CRC32C', () => {
    const tlv = fc.record({
      type: fc.integer({ min: 0, max: 255 }).filter((t) => t !== PP2_TYPE.CRC32C && t !== PP2_TYPE.SSL && t !== PP2_TYPE.UNIQUE_ID),
      value: fc.uint8Array({ maxLength: 100 }).map((a) => Buffer.from(a)),
    });
    fc.assert(
      fc.property(
        endpoints,
        fc.array(tlv, { maxLength: 8 }),
        fc.boolean(),
        fc.uint8Array({ maxLength: 20 }),
        fc.nat(),
        (e, tlvs, withCrc, tail, cutSeed) => {
          const buf = buildProxyHeaderV2({ ...e, tlvs, crc32c: withCrc });
          const r = parseProxyHeader(Buffer.concat([buf, Buffer.from(tail)]));
          if (r.kind !== 'header') throw new Error('expected a header');
          expect(r).toMatchObject({
            version: 2,
            length: buf.length,
            command: 'PROXY',
            family: e.family,
            source: canonical(e.family, e.source),
            destination: canonical(e.family, e.destination),
          });
          const expectedTlvs = withCrc ? [...tlvs.map((t) => ({ type: t.type, value: t.value })), { type: 3, value: buf.subarray(-4) }] : tlvs;
          expect(r.tlvs).toEqual(expectedTlvs);
          expect(parseProxyHeader(buf.subarray(0, cutSeed % buf.length))).toEqual({ kind: 'need-more' });
        },
      ),
      { numRuns: 500 },
    );
  });

  it('property: v2 LOCAL and UNSPEC round-trip as unknown', () => {
    fc.assert(
      fc.property(fc.constantFrom('LOCAL' as const, 'PROXY' as const), fc.array(fc.uint8Array({ maxLength: 50 }), { maxLength: 4 }), (command, values) => {
        const buf = buildProxyHeaderV2({ command, tlvs: values.map((v) => ({ type: 0xe0, value: Buffer.from(v) })) });
        expect(parseProxyHeader(buf)).toEqual({ kind: 'header', version: 2, length: buf.length, command, family: 'unknown' });
      }),
    );
  });
});

describe('arbitrary input', () => {
  it('property: never throws anything but GW_ERR_MUX_BAD_PROXY_HEADER, and stays bounded', () => {
    const v2head = fc
      .tuple(fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 0x1100 }))
      .map(([vc, fam, len]) => Buffer.concat([PROXY_V2_SIGNATURE, Buffer.from([vc, fam, len >> 8, len & 0xff])]));
    const input = fc.oneof(
      fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
      fc.tuple(v2head, fc.uint8Array({ maxLength: 5000 })).map(([h, rest]) => Buffer.concat([h, Buffer.from(rest)])),
      fc
        .tuple(fc.constantFrom('PROXY TCP4 ', 'PROXY TCP6 ', 'PROXY UNKNOWN'), fc.stringMatching(/^[0-9a-f:. \r\n]{0,110}$/))
        .map(([p, rest]) => b(p + rest)),
      // a valid v2 header with TLVs whose bytes are then mangled
      fc
        .tuple(fc.array(fc.uint8Array({ maxLength: 30 }), { maxLength: 5 }), fc.array(fc.tuple(fc.nat(), fc.nat(255)), { maxLength: 4 }))
        .map(([values, edits]) => {
          const buf = buildProxyHeaderV2({
            family: 'tcp4',
            source: { address: '10.0.0.1', port: 1 },
            destination: { address: '10.0.0.2', port: 2 },
            tlvs: values.map((v, i) => ({ type: [1, 2, 5, 0x20, 0xe0][i]!, value: Buffer.from(v) })),
            crc32c: values.length % 2 === 1,
          });
          for (const [at, v] of edits) buf[16 + (at % (buf.length - 16))] = v;
          return buf;
        }),
    );
    fc.assert(
      fc.property(input, (buf) => {
        try {
          const r = parseProxyHeader(buf);
          if (r.kind === 'header') expect(r.length).toBeLessThanOrEqual(buf.length);
          else expect(r.kind).toBe('need-more');
        } catch (err) {
          expect(err).toBeInstanceOf(GatewayError);
          expect((err as GatewayError).code).toBe('GW_ERR_MUX_BAD_PROXY_HEADER');
        }
      }),
      { numRuns: 2000 },
    );
  });
});
