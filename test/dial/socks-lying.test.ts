/**
 * The Dialer's SOCKS5 client against scripted servers (Node net servers answering chosen bytes): each way a
 * SOCKS server can lie or stall ends in its own error code within the deadline, the bytes a server sends with its
 * reply reach the caller, and a password goes only to a server that chose username/password. The parsers of
 * src/dial/socks.ts get their table tests here too; the real server (Dante) is in socks-dante.test.ts.
 */
import net from 'node:net';
import { afterAll, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { buildSocksConnect, parseConnectReply, parseMethodChoice } from '../../src/dial/socks.js';
import { GatewayError } from '../../src/errors.js';
import { captureLogs } from '../helpers/logs.js';
import { dialError as dialErrorOf } from '../helpers/dial.js';

// Every log line of the code under test, at trace level: the last test reads them all for the password.
const logLines = captureLogs();

const PASSWORD = 'hunter2-s3cret';
/** Every error the tests saw, for the final check that no password is in any of them. */
const seen: GatewayError[] = [];

interface Script {
  /** The bytes to answer each message from the client with, in order; undefined: say nothing more. */
  answers: Array<Buffer | 'close' | { end: Buffer } | undefined>;
}

/** A SOCKS "server" that answers the n-th message it gets with answers[n]; records everything it received. */
async function scripted(script: Script): Promise<{ url: (scheme?: string, userinfo?: string) => string; received: () => Buffer; close: () => void }> {
  const got: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    let n = 0;
    s.on('error', () => undefined);
    s.on('data', (d) => {
      got.push(d);
      const answer = script.answers[n++];
      if (answer === 'close') s.end();
      else if (answer && 'end' in answer && !Buffer.isBuffer(answer)) s.end(answer.end);
      else if (answer) s.write(answer);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
  const port = (server.address() as net.AddressInfo).port;
  return {
    url: (scheme = 'socks5h', userinfo = '') => `${scheme}://${userinfo}127.0.0.2:${port}`,
    received: () => Buffer.concat(got),
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

const b = (...bytes: number[]) => Buffer.from(bytes);
const OK_REPLY = b(5, 0, 0, 1, 10, 0, 0, 1, 0x1f, 0x90);

function dialer(url: string, options: ConstructorParameters<typeof Dialer>[0] = {}): Dialer {
  return new Dialer({ env: { HTTPS_PROXY: url }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, ...options });
}

async function dialError(d: Dialer, target = 'proxy.gw.test:443'): Promise<GatewayError> {
  const err = await dialErrorOf(d, target);
  seen.push(err);
  return err;
}

async function withServer(answers: Script['answers'], fn: (s: Awaited<ReturnType<typeof scripted>>) => Promise<void>): Promise<void> {
  const s = await scripted({ answers });
  try {
    await fn(s);
  } finally {
    s.close();
  }
}

describe('a SOCKS5 server that lies', () => {
  it.each([
    ['a wrong version in the method choice', 'GW_ERR_DIAL_SOCKS_MALFORMED', [b(4, 0)]],
    ['an HTTP answer (an HTTP proxy behind socks5://)', 'GW_ERR_DIAL_SOCKS_MALFORMED', [Buffer.from('HTTP/1.1 400 Bad Request\r\n\r\n')]],
    ['a method it was not offered', 'GW_ERR_DIAL_SOCKS_MALFORMED', [b(5, 2)]],
    ['"no acceptable method" to a client without credentials', 'GW_ERR_DIAL_SOCKS_AUTH_REQUIRED', [b(5, 0xff)]],
    ['a wrong version in the reply', 'GW_ERR_DIAL_SOCKS_MALFORMED', [b(5, 0), b(4, 0, 0, 1, 1, 2, 3, 4, 0, 80)]],
    ['a refusal (connection not allowed by ruleset)', 'GW_ERR_DIAL_SOCKS_REFUSED', [b(5, 0), b(5, 2, 0, 1, 0, 0, 0, 0, 0, 0)]],
    ['an unassigned reply code', 'GW_ERR_DIAL_SOCKS_REFUSED', [b(5, 0), b(5, 0x42, 0, 1, 0, 0, 0, 0, 0, 0)]],
    ['an unknown address type in the reply', 'GW_ERR_DIAL_SOCKS_MALFORMED', [b(5, 0), b(5, 0, 0, 9, 1, 2, 3, 4, 0, 80)]],
    ['a bound name of length 0', 'GW_ERR_DIAL_SOCKS_MALFORMED', [b(5, 0), b(5, 0, 0, 3, 0, 0, 80)]],
    ['a close after the method choice', 'GW_ERR_DIAL_SOCKS_CLOSED', [b(5, 0), 'close']],
    ['a close in the middle of the reply', 'GW_ERR_DIAL_SOCKS_CLOSED', [b(5, 0), { end: Buffer.concat([b(5, 0, 0, 4), Buffer.alloc(5)]) }]],
  ] as Array<[string, string, Script['answers']]>)('%s: %s', async (_what, code, answers) => {
    await withServer(answers, async (s) => {
      const err = await dialError(dialer(s.url()));
      expect(err.code).toBe(code);
      expect(err.message).toContain('127.0.0.2');
      expect(err.message).toContain('HTTPS_PROXY');
    });
  });

  it('the refusal names the reply and the hint names the ruleset', async () => {
    await withServer([b(5, 0), b(5, 2, 0, 1, 0, 0, 0, 0, 0, 0)], async (s) => {
      const err = await dialError(dialer(s.url()));
      expect(err.details.reply).toBe(2);
      expect(err.message).toContain('not allowed by ruleset');
      expect(err.hint).toMatch(/rules/);
    });
  });

  it('an HTTP answer says to use http://', async () => {
    await withServer([Buffer.from('HTTP/1.1 400 Bad Request\r\n\r\n')], async (s) => {
      expect((await dialError(dialer(s.url()))).message).toContain('http://');
    });
  });

  it('a server that never answers: no answer within the deadline', async () => {
    await withServer([], async (s) => {
      expect((await dialError(dialer(s.url(), { proxyAnswerTimeoutMs: 300 }))).code).toBe('GW_ERR_DIAL_SOCKS_NO_ANSWER');
    });
  });

  it('a server that stops in the middle of the reply: no answer within the deadline', async () => {
    await withServer([b(5, 0), b(5, 0, 0, 3, 200, 65, 65)], async (s) => {
      expect((await dialError(dialer(s.url(), { proxyAnswerTimeoutMs: 300 }))).code).toBe('GW_ERR_DIAL_SOCKS_NO_ANSWER');
    });
  });

  it('a server that drips its reply a byte at a time: the deadline is the whole handshake\'s, not each read\'s', async () => {
    const reply = Buffer.concat([b(5, 0, 0, 3, 255), Buffer.alloc(255, 0x61), b(0, 80)]);
    const timers = new Set<NodeJS.Timeout>();
    const server = net.createServer((s) => {
      s.on('error', () => undefined);
      let n = 0;
      s.on('data', () => {
        if (n++ > 0) return;
        s.write(b(5, 0));
        let i = 0;
        const drip = setInterval(() => (i < reply.length && !s.destroyed ? s.write(reply.subarray(i, ++i)) : clearInterval(drip)), 20);
        timers.add(drip);
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
    try {
      const url = `socks5h://127.0.0.2:${(server.address() as net.AddressInfo).port}`;
      expect((await dialError(dialer(url, { proxyAnswerTimeoutMs: 300 }))).code).toBe('GW_ERR_DIAL_SOCKS_NO_ANSWER');
    } finally {
      for (const t of timers) clearInterval(t);
      server.close();
    }
  });

  it('"no acceptable method" to a client with credentials: refused, without the password', async () => {
    await withServer([b(5, 0xff)], async (s) => {
      const err = await dialError(dialer(s.url('socks5h', `alice:${PASSWORD}@`)));
      expect(err.code).toBe('GW_ERR_DIAL_SOCKS_AUTH_REFUSED');
      expect(JSON.stringify({ m: err.message, d: err.details, h: err.hint })).not.toContain(PASSWORD);
      expect(err.message).toContain('alice:***@');
      expect(s.received().includes(Buffer.from(PASSWORD))).toBe(false);
    });
  });

  it('wrong credentials: refused naming the user, never the password', async () => {
    await withServer([b(5, 2), b(1, 1)], async (s) => {
      const err = await dialError(dialer(s.url('socks5h', `alice:${PASSWORD}@`)));
      expect(err.code).toBe('GW_ERR_DIAL_SOCKS_AUTH_REFUSED');
      expect(err.message).toContain('"alice"');
      expect(JSON.stringify({ m: err.message, d: err.details, h: err.hint })).not.toContain(PASSWORD);
      // RFC 1929's request went to the server that asked for it
      expect(s.received().includes(Buffer.concat([b(1, 5), Buffer.from('alice'), b(PASSWORD.length), Buffer.from(PASSWORD)]))).toBe(true);
    });
  });
});

describe('a SOCKS5 server that behaves', () => {
  it('hands over the bytes the server sent in the same packet as its reply, byte-exact', async () => {
    const banner = Buffer.from('SSH-2.0-OpenSSH_9.2\r\n');
    await withServer([b(5, 0), Buffer.concat([OK_REPLY, banner])], async (s) => {
      const socket = await dialer(s.url()).dial('proxy.gw.test:22');
      // A caller that starts reading a while later still gets them.
      await new Promise((r) => setTimeout(r, 50));
      // Bounded, so that a lost banner fails the test rather than hanging it.
      const first = await new Promise<Buffer>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('the bytes sent with the reply never arrived')), 5_000);
        socket.once('data', (c: Buffer) => {
          clearTimeout(timer);
          resolve(c);
        });
      });
      expect(first.equals(banner)).toBe(true);
      socket.destroy();
    });
  });

  it('a server that chose no authentication never sees the password', async () => {
    await withServer([b(5, 0), OK_REPLY], async (s) => {
      const socket = await dialer(s.url('socks5h', `alice:${PASSWORD}@`)).dial('proxy.gw.test:443');
      socket.destroy();
      // The greeting offered both methods; nothing else but the CONNECT followed.
      expect(s.received().subarray(0, 4).equals(b(5, 2, 0, 2))).toBe(true);
      expect(s.received().includes(Buffer.from(PASSWORD))).toBe(false);
    });
  });

  it('socks5h:// sends the name; socks5:// resolves it here and sends the address', async () => {
    const lookup: net.LookupFunction = (_host, _o, cb) => (cb as unknown as (e: null, a: string, f: number) => void)(null, '192.0.2.7', 4);
    for (const [scheme, expected] of [
      ['socks5h', buildSocksConnect('proxy.gw.test', 443)],
      ['socks5', b(5, 1, 0, 1, 192, 0, 2, 7, 1, 0xbb)],
    ] as const) {
      await withServer([b(5, 0), OK_REPLY], async (s) => {
        const socket = await dialer(s.url(scheme), { lookup }).dial('proxy.gw.test:443');
        socket.destroy();
        expect(s.received().subarray(3).equals(expected), scheme).toBe(true);
      });
    }
  });

  it('socks5:// with a name that does not resolve here: unreachable, with the socks5h hint', async () => {
    const lookup: net.LookupFunction = (host, _o, cb) => (cb as unknown as (e: Error) => void)(Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' }));
    await withServer([b(5, 0), OK_REPLY], async (s) => {
      const err = await dialError(dialer(s.url('socks5'), { lookup }));
      expect(err.code).toBe('GW_ERR_DIAL_UNREACHABLE');
      expect(err.hint).toContain('socks5h://');
      expect(s.received().length).toBe(0);
    });
  });
});

describe('a dial the caller cancels', () => {
  it('during the handshake: aborted, and the socket to the SOCKS server is closed', async () => {
    let closed: Promise<void> | undefined;
    const server = net.createServer((s) => {
      s.on('error', () => undefined);
      s.resume(); // read, so that the client's close is seen
      closed = new Promise((r) => s.once('close', () => r()));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.2', r));
    try {
      const controller = new AbortController();
      const url = `socks5h://alice:${PASSWORD}@127.0.0.2:${(server.address() as net.AddressInfo).port}`;
      const dialing = dialer(url).dial('proxy.gw.test:443', { signal: controller.signal });
      const settled = dialing.then(() => undefined, (err: unknown) => err);
      while (closed === undefined) await new Promise((r) => setTimeout(r, 10));
      controller.abort();
      const err = (await settled) as GatewayError;
      expect(err.code).toBe('GW_ERR_DIAL_ABORTED');
      seen.push(err);
      await closed;
    } finally {
      server.close();
    }
  });
});

afterAll(() => {
  // No password in any error (message, hint, details) or in any log line of the dials above.
  expect(seen.length).toBeGreaterThan(10);
  expect(logLines.length).toBeGreaterThan(0);
  for (const text of [...seen.map((e) => JSON.stringify({ m: e.message, h: e.hint, d: e.details })), ...logLines]) expect(text).not.toContain(PASSWORD);
});

describe('the SOCKS5 parsers', () => {
  it('encode IPv6 targets as 16 bytes', () => {
    expect(buildSocksConnect('2001:db8::1', 443).toString('hex')).toBe(`05010004${'20010db8000000000000000000000001'}01bb`);
    expect(buildSocksConnect('::ffff:192.0.2.1', 80).toString('hex')).toBe(`05010004${'00000000000000000000ffffc0000201'}0050`);
  });

  it('wait for more bytes rather than guess, and stop by the longest reply', () => {
    expect(parseMethodChoice(b(5), false)).toEqual({ complete: false });
    expect(parseConnectReply(b(5, 0, 0))).toEqual({ complete: false });
    const name = Buffer.concat([b(5, 0, 0, 3, 255), Buffer.alloc(255, 0x61), b(0, 80), Buffer.from('tunnel bytes')]);
    const r = parseConnectReply(name);
    expect(r).toMatchObject({ complete: true, length: 262 });
    expect(parseConnectReply(name.subarray(0, 261))).toEqual({ complete: false });
    const v6 = Buffer.concat([b(5, 0, 0, 4), Buffer.from('20010db8000000000000000000000001', 'hex'), b(1, 0xbb)]);
    expect(parseConnectReply(v6)).toEqual({ complete: true, length: 22, bound: '[2001:db8:0:0:0:0:0:1]:443' });
    expect(parseConnectReply(OK_REPLY)).toEqual({ complete: true, length: 10, bound: '10.0.0.1:8080' });
  });
});
