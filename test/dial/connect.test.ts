import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { basicCredentials } from '../../src/dial/auth/basic.js';
import { buildConnectRequest, parseConnectResponse, refusalFraming, MAX_CONNECT_RESPONSE_HEAD, MAX_REFUSAL_BODY } from '../../src/dial/connect.js';
import { GatewayError } from '../../src/errors.js';

const b = (s: string) => Buffer.from(s, 'latin1');

describe('CONNECT request', () => {
  it('uses authority form, Host, and the Proxy-Authorization it is given', () => {
    const req = buildConnectRequest({ host: 'proxy.example.com', port: 3024 }, basicCredentials('alice', 'p@ss'), 'gateway/test');
    expect(req).toBe(
      'CONNECT proxy.example.com:3024 HTTP/1.1\r\nHost: proxy.example.com:3024\r\nUser-Agent: gateway/test\r\n' +
        `Proxy-Authorization: Basic ${Buffer.from('alice:p@ss').toString('base64')}\r\n\r\n`,
    );
  });
  it('brackets IPv6 targets', () => {
    expect(buildConnectRequest({ host: '2001:db8::1', port: 443 })).toBe('CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n');
  });
});

describe("a refusal's framing: can its connection carry the next request", () => {
  const head = (text: string) => {
    const r = parseConnectResponse(b(`${text}\r\n\r\n`));
    if (!r.complete) throw new Error('incomplete');
    return r;
  };
  it.each([
    ['HTTP/1.1 407 x\r\nContent-Length: 3061', true, 3061],
    ['HTTP/1.1 407 x\r\nContent-Length: 0', true, 0],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nConnection: keep-alive', true, 5],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nConnection: close', false, 0],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nProxy-Connection: Close', false, 0],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nConnection: foo, close', false, 0],
    ['HTTP/1.0 407 x\r\nContent-Length: 5', false, 0],
    ['HTTP/1.0 407 x\r\nContent-Length: 5\r\nConnection: Keep-Alive', true, 5],
    ['HTTP/1.1 407 x', false, 0],
    ['HTTP/1.1 407 x\r\nTransfer-Encoding: chunked', false, 0],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nContent-Length: 6', false, 0],
    ['HTTP/1.1 407 x\r\nContent-Length: 5\r\nContent-Length: 5', true, 5],
    ['HTTP/1.1 407 x\r\nContent-Length: -1', false, 0],
    [`HTTP/1.1 407 x\r\nContent-Length: ${MAX_REFUSAL_BODY + 1}`, false, 0],
  ])('%j: reusable %s, body %d', (text, reusable, bodyLength) => {
    expect(refusalFraming(head(text))).toEqual({ reusable, bodyLength });
  });
});

describe('CONNECT answer parser', () => {
  it.each([
    ['HTTP/1.1 200 Connection established\r\n\r\n', 200, 'Connection established', 0],
    ['HTTP/1.0 200 OK\r\nProxy-Agent: squid\r\n\r\n', 200, 'OK', 0],
    ['HTTP/1.1 200\r\n\r\n', 200, '', 0],
    ['HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="x"\r\nContent-Length: 5\r\n\r\nhello', 407, 'Proxy Authentication Required', 5],
    ['HTTP/1.1 200 OK\n\nSSH-2.0-x', 200, 'OK', 9],
    ['HTTP/1.1 200 OK\r\n\r\n\x16\x03\x01', 200, 'OK', 3],
  ])('%j', (text, status, reason, trailing) => {
    const buf = b(text);
    const r = parseConnectResponse(buf);
    if (!r.complete) throw new Error('expected complete');
    expect(r.statusCode).toBe(status);
    expect(r.reason).toBe(reason);
    expect(buf.length - r.headLength).toBe(trailing);
  });

  it.each(['', 'H', 'HTTP/1.1 200 OK\r\n', 'HTTP/1.1 200 OK\r\nX: y\r\n'])('%j is incomplete', (text) => {
    expect(parseConnectResponse(b(text)).complete).toBe(false);
  });

  it.each([
    'SSH-2.0-OpenSSH\r\n\r\n',
    'hello',
    '\x16\x03\x01\x02',
    'HTTP/1.1 2000 OK\r\n\r\n',
    'HTTP/1.1 099 OK\r\n\r\n',
    'HTTP/x 200 OK\r\n\r\n',
    'HTTP/1.1 200 OK\r\nno colon here\r\n\r\n',
    'HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n',
  ])('%j is malformed', (text) => {
    expect(() => parseConnectResponse(b(text))).toThrow(expect.objectContaining({ code: 'GW_ERR_DIAL_PROXY_MALFORMED' }));
  });

  it('refuses an endless head instead of buffering it', () => {
    const head = b(`HTTP/1.1 200 OK\r\nX: ${'a'.repeat(MAX_CONNECT_RESPONSE_HEAD)}`);
    expect(() => parseConnectResponse(head)).toThrow(expect.objectContaining({ code: 'GW_ERR_DIAL_PROXY_MALFORMED' }));
  });

  const statusLine = fc
    .tuple(fc.constantFrom('1.0', '1.1'), fc.integer({ min: 100, max: 599 }), fc.stringMatching(/^[A-Za-z ]{0,20}$/))
    .map(([v, code, reason]) => ({ text: `HTTP/${v} ${code}${reason ? ` ${reason}` : ''}`, code }));
  const header = fc.tuple(fc.stringMatching(/^[A-Za-z][A-Za-z0-9-]{0,15}$/), fc.stringMatching(/^[ -~]{0,30}$/)).map(([n, v]) => `${n}: ${v}`);

  it('gives the same answer however the bytes are split, and never eats tunnel bytes', () => {
    fc.assert(
      fc.property(statusLine, fc.array(header, { maxLength: 5 }), fc.uint8Array({ maxLength: 64 }), fc.nat(), (sl, headers, tail, cut) => {
        const head = b(`${[sl.text, ...headers].join('\r\n')}\r\n\r\n`);
        const whole = Buffer.concat([head, Buffer.from(tail)]);
        const r = parseConnectResponse(whole);
        if (!r.complete) throw new Error('expected complete');
        expect(r.statusCode).toBe(sl.code);
        expect(r.headers).toHaveLength(headers.length);
        expect(whole.subarray(r.headLength).equals(Buffer.from(tail))).toBe(true);
        const at = cut % head.length;
        // A prefix that stops inside the head is never complete and never an error.
        expect(parseConnectResponse(whole.subarray(0, at)).complete).toBe(false);
      }),
    );
  });

  it('throws only GatewayErrors on arbitrary bytes', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 200 }), (bytes) => {
        try {
          parseConnectResponse(Buffer.from(bytes));
        } catch (err) {
          expect(err).toBeInstanceOf(GatewayError);
        }
      }),
    );
  });
});
