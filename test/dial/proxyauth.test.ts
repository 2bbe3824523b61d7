/**
 * The Dialer's proxy authentication against scripted proxies (a Node server per test that answers each CONNECT
 * as the test says), for what squid cannot be made to do: the traps curl's test suite knows. Each proxy records
 * every request head it got, on which connection, so a test can say what was and was not sent. Every log line of
 * the code under test is captured, and the last test checks that no password and no Proxy-Authorization value
 * reached them.
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { basicCredentials, basicScheme } from '../../src/dial/auth/basic.js';
import { digestScheme } from '../../src/dial/auth/digest.js';
import { makeNegotiateScheme, type GssapiBinding } from '../../src/dial/auth/negotiate.js';
import { ntlmScheme } from '../../src/dial/auth/ntlm.js';
import { PROXY_AUTH_SCHEMES } from '../../src/dial/auth/scheme.js';
import type { ProxyAuthScheme } from '../../src/dial/auth/types.js';
import { Dialer, type DialerOptions } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { captureLogs } from '../helpers/logs.js';
import { dialError as dialErrorOf } from '../helpers/dial.js';

const logLines = captureLogs();

const USER = 'alice';
const PASSWORD = `pw-${randomBytes(6).toString('hex')}`;
const TARGET = 'app.gw.test:443';

interface Seen {
  /** Which accepted connection (0, 1, ...) carried the request. */
  conn: number;
  /** The request's Proxy-Authorization value, or undefined. */
  authorization: string | undefined;
}

/** What the proxy does with one request: an answer to write, then close or keep, or a tunnel (echo). */
type Reply = { write: string; close?: boolean; reset?: boolean } | 'tunnel' | 'stall';
type Script = (n: number, seen: Seen) => Reply;

interface ScriptedProxy {
  url: string;
  seen: Seen[];
  close(): void;
}

const proxies: ScriptedProxy[] = [];
afterEach(() => {
  for (const p of proxies.splice(0)) p.close();
});

/** A proxy on 127.0.0.2 (127.0.0.1 is refused as a proxy host) that answers the n-th request with script(n). */
async function scripted(script: Script): Promise<ScriptedProxy> {
  const seen: Seen[] = [];
  const sockets = new Set<net.Socket>();
  let conns = 0;
  const server = net.createServer((socket) => {
    const conn = conns++;
    sockets.add(socket);
    socket.on('error', () => undefined);
    let buf = '';
    const onData = (c: Buffer) => {
      buf += c.toString('latin1');
      for (let end = buf.indexOf('\r\n\r\n'); end >= 0; end = buf.indexOf('\r\n\r\n')) {
        const head = buf.slice(0, end);
        buf = buf.slice(end + 4);
        const auth = /^proxy-authorization: *(.*)$/im.exec(head)?.[1];
        const s: Seen = { conn, authorization: auth };
        seen.push(s);
        const reply = script(seen.length - 1, s);
        if (reply === 'stall') return;
        if (reply === 'tunnel') {
          socket.off('data', onData);
          socket.write('HTTP/1.1 200 Connection established\r\n\r\n');
          socket.pipe(socket);
          return;
        }
        socket.write(reply.write);
        if (reply.reset) {
          // A reset a moment after the answer, while the client is still computing its next message.
          socket.off('data', onData);
          setTimeout(() => socket.resetAndDestroy(), 20);
          return;
        }
        if (reply.close) {
          // Nothing more is read from this connection: what a client sends after the close is not a request seen.
          socket.off('data', onData);
          socket.end();
          return;
        }
      }
    };
    socket.on('data', onData);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.2', resolve));
  const port = (server.address() as net.AddressInfo).port;
  const p = {
    url: `http://${encodeURIComponent(USER)}:${encodeURIComponent(PASSWORD)}@127.0.0.2:${port}`,
    seen,
    close: () => {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
  proxies.push(p);
  return p;
}

const BODY = 'Authentication required\n';
function challenge(headers: string[], extra: string[] = [], version = '1.1'): string {
  const lines = [`HTTP/${version} 407 Proxy Authentication Required`, ...headers.map((h) => `Proxy-Authenticate: ${h}`), ...extra];
  if (!extra.some((l) => /^content-length/i.test(l))) lines.push(`Content-Length: ${BODY.length}`);
  return `${lines.join('\r\n')}\r\n\r\n${BODY}`;
}
const DIGEST = (nonce = randomBytes(8).toString('hex'), more = '') => `Digest realm="corp", nonce="${nonce}", qop="auth"${more}`;
const BASIC = 'Basic realm="corp"';

/** The schemes of PROXY_AUTH_SCHEMES, with a Negotiate that has a credential cache (a file) but no kerberos module, whatever this machine has. */
const SCHEMES = PROXY_AUTH_SCHEMES.map((s) =>
  s.name === 'Negotiate' ? makeNegotiateScheme({ binding: '/nonexistent/kerberos', env: { KRB5CCNAME: `FILE:${fileURLToPath(import.meta.url)}` } }) : s,
);

function dialer(url: string, options: DialerOptions = {}): Dialer {
  return new Dialer({ env: { HTTPS_PROXY: url }, connectTimeoutMs: 5_000, proxyAnswerTimeoutMs: 5_000, authSchemes: SCHEMES, ...options });
}

/** A GSSAPI stand-in: Negotiate's can() then looks only at the credentials. */
const fakeGssapi: GssapiBinding = {
  GSS_MECH_OID_SPNEGO: 6,
  GSS_C_MUTUAL_FLAG: 2,
  GSS_C_SEQUENCE_FLAG: 8,
  initializeClient: async () => ({ contextComplete: false, step: async () => 'YIIB' }),
};

/** MS-NLMP 4.2.4.3's CHALLENGE_MESSAGE (its NTLMv2 example), base64. */
const NTLM_TYPE2 = Buffer.from(
  '4e544c4d53535000020000000c000c003800000033828ae20123456789abcdef00000000000000002400240044000000060070170000000f' +
    '53006500720076006500720002000c0044006f006d00610069006e0001000c0053006500720076006500720000000000',
  'hex',
).toString('base64');

async function roundTrip(socket: net.Socket): Promise<string> {
  const got = new Promise<string>((resolve) => socket.once('data', (c: Buffer) => resolve(c.toString())));
  socket.write('ping');
  const text = await got;
  socket.destroy();
  return text;
}

const dialError = (d: Dialer): Promise<GatewayError> => dialErrorOf(d, TARGET);

const scheme = (v: string | undefined) => v?.split(' ')[0];

describe('choosing the scheme', () => {
  it('Digest and Basic in two headers: Digest, and Basic is never sent', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([BASIC, DIGEST()]) } : scheme(p.seen[n]!.authorization) === 'Digest' ? 'tunnel' : { write: challenge([BASIC, DIGEST()]) }));
    expect(await roundTrip(await dialer(p.url).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => scheme(s.authorization))).toEqual([undefined, 'Digest']);
    // One connection: the 407's body was read and the answer went on the same one.
    expect(p.seen.map((s) => s.conn)).toEqual([0, 0]);
  });

  it('several challenges in one header, Digest the strongest this client can do (no Kerberos module, user alice without a domain is NTLM\'s too)', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([`Negotiate, ${BASIC}, ${DIGEST()}`]) } : 'tunnel'));
    await roundTrip(await dialer(p.url).dial(TARGET));
    expect(scheme(p.seen[1]!.authorization)).toBe('Digest');
    expect(p.seen[1]!.authorization).toContain(`username="${USER}"`);
    expect(p.seen[1]!.authorization).toContain(`uri="${TARGET}"`);
  });

  it('Basic alone is answered; nothing is sent before the 407', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([BASIC]) } : 'tunnel'));
    await roundTrip(await dialer(p.url).dial(TARGET));
    expect(p.seen.map((s) => s.authorization)).toEqual([undefined, basicCredentials(USER, PASSWORD)]);
  });

  it('after Basic opened a tunnel, the next dial through the same URL sends it first; a 407 then makes it choose again', async () => {
    let offer = [BASIC];
    const p = await scripted((_n, s) => (s.authorization === undefined || scheme(s.authorization) !== scheme(offer[0]) ? { write: challenge(offer) } : 'tunnel'));
    const d = dialer(p.url);
    await roundTrip(await d.dial(TARGET));
    await roundTrip(await d.dial(TARGET));
    expect(p.seen.map((s) => scheme(s.authorization))).toEqual([undefined, 'Basic', 'Basic']);
    // The proxy now wants Digest: the pre-emptive Basic meets a 407, and Digest answers it.
    offer = [DIGEST(), BASIC];
    await roundTrip(await d.dial(TARGET));
    expect(p.seen.slice(3).map((s) => scheme(s.authorization))).toEqual(['Basic', 'Digest']);
    // Forgotten: the dial after that sends nothing first (Digest is never pre-emptive).
    await roundTrip(await d.dial(TARGET));
    expect(scheme(p.seen[5]!.authorization)).toBeUndefined();
  });
});

describe('pre-emptive Basic refused', () => {
  it('a 407 offering Basic again to the pre-emptive Basic: refused at once, not sent twice', async () => {
    let accept = true;
    const p = await scripted((_n, s) => (accept && s.authorization !== undefined ? 'tunnel' : { write: challenge([BASIC]) }));
    const d = dialer(p.url);
    await roundTrip(await d.dial(TARGET));
    accept = false; // the password was changed at the proxy
    const before = p.seen.length;
    const err = await dialError(d);
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(p.seen.slice(before).map((s) => scheme(s.authorization))).toEqual(['Basic']);
  });
});

describe("curl's traps", () => {
  it('a 407 with Connection: close: a new connection, and the handshake goes on there', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([DIGEST()], ['Connection: close']), close: true } : 'tunnel'));
    expect(await roundTrip(await dialer(p.url).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => [s.conn, scheme(s.authorization)])).toEqual([
      [0, undefined],
      [1, 'Digest'],
    ]);
  });

  it.each([
    ['HTTP/1.0 without keep-alive', challenge([DIGEST()], [], '1.0')],
    ['no Content-Length (the body ends with the connection)', `HTTP/1.1 407 x\r\nProxy-Authenticate: ${DIGEST()}\r\n\r\nbody`],
    ['chunked', `HTTP/1.1 407 x\r\nProxy-Authenticate: ${DIGEST()}\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n`],
  ])('%s: also a new connection', async (_what, answer) => {
    const p = await scripted((n) => (n === 0 ? { write: answer, close: true } : 'tunnel'));
    await roundTrip(await dialer(p.url).dial(TARGET));
    expect(p.seen.map((s) => s.conn)).toEqual([0, 1]);
  });

  it('a 200 to the first message of a multi-step scheme opens the tunnel', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['Twostep', BASIC]) } : 'tunnel'));
    const d = dialer(p.url, { authSchemes: [twoStep(), ...PROXY_AUTH_SCHEMES] });
    expect(await roundTrip(await d.dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => s.authorization)).toEqual([undefined, 'Twostep step1']);
  });

  /** A two-step scheme that lost its first connection after step 1: both steps again, on the second connection. */
  const STARTED_OVER = [
    [0, undefined],
    [0, 'Twostep step1'],
    [1, 'Twostep step1'],
    [1, 'Twostep step2'],
  ];

  it('a connection-bound scheme whose second step meets Connection: close starts over from its first step on a new connection', async () => {
    const p = await scripted((n) =>
      n === 0 ? { write: challenge(['Twostep']) } : n === 1 ? { write: challenge(['Twostep abc='], ['Connection: close']), close: true } : n === 2 ? { write: challenge(['Twostep abc=']) } : 'tunnel',
    );
    expect(await roundTrip(await dialer(p.url, { authSchemes: [twoStep()] }).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => [s.conn, s.authorization])).toEqual(STARTED_OVER);
  });

  it('... and when the proxy closes the new connection midway too: a clear error, no third connection', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['Twostep']) } : { write: challenge(['Twostep abc='], ['Connection: close']), close: true }));
    const err = await dialError(dialer(p.url, { authSchemes: [twoStep()] }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.message).toMatch(/closed the connection in the middle of the Twostep handshake/);
    expect(p.seen.map((s) => s.conn)).toEqual([0, 0, 1]);
  });

  it('a kept-alive connection closed silently after a 407 (no Connection: close): one re-dial that goes on with the handshake', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([DIGEST()]), close: true } : 'tunnel'));
    expect(await roundTrip(await dialer(p.url).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => [s.conn, scheme(s.authorization)])).toEqual([
      [0, undefined],
      [1, 'Digest'],
    ]);
  });

  it('a connection-bound scheme whose connection is closed silently after its challenge starts over on the re-dial', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['Twostep']) } : n === 1 ? { write: challenge(['Twostep abc=']), close: true } : n === 2 ? { write: challenge(['Twostep abc=']) } : 'tunnel'));
    expect(await roundTrip(await dialer(p.url, { authSchemes: [twoStep()] }).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => [s.conn, s.authorization])).toEqual(STARTED_OVER);
  });

  it('a connection reset while the client computes its answer (a slow KDC): no crash, one re-dial that starts over', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['Twostep']), reset: true } : n === 1 ? { write: challenge(['Twostep abc=']) } : 'tunnel'));
    expect(await roundTrip(await dialer(p.url, { authSchemes: [twoStep(2, 200)] }).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => [s.conn, s.authorization])).toEqual([
      [0, undefined],
      [1, 'Twostep step1'],
      [1, 'Twostep step2'],
    ]);
  });

  it('silent closes after every 407: one re-dial only, then GW_ERR_DIAL_PROXY_CLOSED', async () => {
    const p = await scripted(() => ({ write: challenge(['Twostep abc=']), close: true }));
    const err = await dialError(dialer(p.url, { authSchemes: [twoStep(Infinity)] }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_CLOSED');
    expect(p.seen.map((s) => s.conn)).toEqual([0, 1]);
  });

  it('a challenge loop ends after 4 answers with GW_ERR_DIAL_PROXY_AUTH_LOOP', async () => {
    const p = await scripted(() => ({ write: challenge(['Twostep more=1']) }));
    const err = await dialError(dialer(p.url, { authSchemes: [twoStep(Infinity)] }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_LOOP');
    expect(err.message).toMatch(/after 4 answers with Twostep/);
    expect(err.hint).toMatch(/authentication log/);
    expect(p.seen).toHaveLength(5);
  });

  it('a Digest proxy that says stale=true for ever gets two answers, then the refusal', async () => {
    const p = await scripted(() => ({ write: challenge([DIGEST(undefined, ', stale=true')]) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(p.seen.map((s) => scheme(s.authorization))).toEqual([undefined, 'Digest', 'Digest']);
  });

  it('never a downgrade: after Digest, a 407 offering only Basic ends the dial and Basic is never sent', async () => {
    const p = await scripted((n) => ({ write: challenge(n === 0 ? [DIGEST(), BASIC] : [BASIC]) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.message).toContain('refused the Digest credentials of user "alice"');
    expect(err.message).toContain('then offered Basic instead');
    expect(p.seen.map((s) => scheme(s.authorization))).toEqual([undefined, 'Digest']);
  });

  it('wrong credentials (407 again with a fresh nonce, not stale): refused, with the scheme and user', async () => {
    const p = await scripted(() => ({ write: challenge([DIGEST()]) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REFUSED');
    expect(err.details).toMatchObject({ status: 407, scheme: 'Digest' });
    expect(p.seen).toHaveLength(2);
  });
});

describe('407s this client cannot answer', () => {
  it('only Negotiate, and no kerberos module: GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE naming the fix, nothing sent', async () => {
    const p = await scripted(() => ({ write: challenge(['Negotiate']) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE');
    expect(err.message).toContain('apt-get install libkrb5-dev');
    expect(err.details.offered).toEqual(['Negotiate']);
    expect(p.seen).toHaveLength(1);
  });

  it('only Negotiate, and no Kerberos credentials: GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED, the hint naming kinit', async () => {
    const p = await scripted(() => ({ write: challenge(['Negotiate']) }));
    const noTicket = makeNegotiateScheme({ binding: fakeGssapi, env: { KRB5CCNAME: 'FILE:/nonexistent/ccache' } });
    const err = await dialError(dialer(p.url, { authSchemes: [noTicket] }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED');
    expect(err.hint).toContain('kinit');
    expect(p.seen).toHaveLength(1);
  });

  it('Negotiate and NTLM offered, no Kerberos credentials: NTLM with the URL\'s account, Negotiate never tried', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['Negotiate', 'NTLM']) } : n === 1 ? { write: challenge([`NTLM ${NTLM_TYPE2}`]) } : 'tunnel'));
    const noTicket = makeNegotiateScheme({ binding: fakeGssapi, env: { KRB5CCNAME: 'FILE:/nonexistent/ccache' } });
    await roundTrip(await dialer(p.url, { authSchemes: [noTicket, ntlmScheme, digestScheme, basicScheme] }).dial(TARGET));
    expect(p.seen.map((s) => [s.conn, s.authorization?.slice(0, 21)])).toEqual([
      [0, undefined],
      [0, 'NTLM TlRMTVNTUAABAAAA'],
      [0, 'NTLM TlRMTVNTUAADAAAA'],
    ]);
  });

  it('a proxy that answers 200 to NTLM\'s Type 1 has opened the tunnel: no Type 3 is computed or sent', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge(['NTLM']) } : 'tunnel'));
    expect(await roundTrip(await dialer(p.url).dial(TARGET))).toBe('ping');
    expect(p.seen.map((s) => s.authorization?.slice(0, 21))).toEqual([undefined, 'NTLM TlRMTVNTUAABAAAA']);
  });

  it('NTLM: a proxy that closes after its Type 2 (Connection: close) gets Type 1 again on a new connection', async () => {
    const p = await scripted((n) =>
      n === 0 ? { write: challenge(['NTLM']) } : n === 1 ? { write: challenge([`NTLM ${NTLM_TYPE2}`], ['Connection: close']), close: true } : n === 2 ? { write: challenge([`NTLM ${NTLM_TYPE2}`]) } : 'tunnel',
    );
    await roundTrip(await dialer(p.url).dial(TARGET));
    expect(p.seen.map((s) => [s.conn, s.authorization?.slice(0, 21)])).toEqual([
      [0, undefined],
      [0, 'NTLM TlRMTVNTUAABAAAA'],
      [1, 'NTLM TlRMTVNTUAABAAAA'],
      [1, 'NTLM TlRMTVNTUAADAAAA'],
    ]);
  });

  it('NTLM: a lying Type 2 (a field outside the message) is GW_ERR_DIAL_PROXY_NTLM_CHALLENGE, nothing computed from the password is sent', async () => {
    const liar = Buffer.from(NTLM_TYPE2, 'base64');
    liar.writeUInt32LE(0xfff0, 16); // the target name's offset, far outside
    const p = await scripted((n) => (n === 0 ? { write: challenge(['NTLM']) } : { write: challenge([`NTLM ${liar.toString('base64')}`]) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NTLM_CHALLENGE');
    expect(p.seen).toHaveLength(2);
  });

  it('Digest with an algorithm it does not know: unsupported, and says why', async () => {
    const p = await scripted(() => ({ write: challenge(['Digest realm="r", nonce="n", algorithm=SHA-1']) }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_UNSUPPORTED');
    expect(err.message).toContain('algorithm=SHA-1');
  });

  it('a 407 with no Proxy-Authenticate at all', async () => {
    const p = await scripted(() => ({ write: 'HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n' }));
    const err = await dialError(dialer(p.url));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_UNSUPPORTED');
    expect(err.message).toContain('no Proxy-Authenticate header');
  });

  it('no credentials in the URL: authentication required, naming the schemes', async () => {
    const p = await scripted(() => ({ write: challenge([DIGEST(), BASIC]) }));
    const err = await dialError(dialer(p.url.replace(/\/\/[^@]*@/, '//')));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_AUTH_REQUIRED');
    expect(err.message).toContain('it offers Digest, Basic');
  });

  it('a Proxy-Authenticate that breaks the grammar is GW_ERR_DIAL_PROXY_MALFORMED', async () => {
    const p = await scripted(() => ({ write: challenge(['Digest realm="unclosed']) }));
    expect((await dialError(dialer(p.url))).code).toBe('GW_ERR_DIAL_PROXY_MALFORMED');
  });
});

describe('slow and lying proxies: nothing waits past its deadline', () => {
  it('a 407 whose body never comes: GW_ERR_DIAL_PROXY_NO_ANSWER', async () => {
    const p = await scripted(() => ({ write: challenge([DIGEST()], ['Content-Length: 1000']).slice(0, -BODY.length) }));
    const err = await dialError(dialer(p.url, { proxyAnswerTimeoutMs: 300 }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NO_ANSWER');
  });

  it('no answer at all to the authenticated CONNECT: GW_ERR_DIAL_PROXY_NO_ANSWER', async () => {
    const p = await scripted((n) => (n === 0 ? { write: challenge([DIGEST()]) } : 'stall'));
    const err = await dialError(dialer(p.url, { proxyAnswerTimeoutMs: 300 }));
    expect(err.code).toBe('GW_ERR_DIAL_PROXY_NO_ANSWER');
  });
});

afterAll(() => {
  // Runs after every test above, each of which logged its handshake (several failing).
  const all = logLines.join('');
  expect(all).toContain('answering the proxy');
  expect(all).not.toContain(PASSWORD);
  expect(all).not.toContain(basicCredentials(USER, PASSWORD).split(' ')[1]);
  expect(all).not.toMatch(/response=|Proxy-Authorization|"authorization"/i);
  // No NTLM message (Type 1 or 3) and no Negotiate token, though the tests above sent both.
  expect(all).toContain('"scheme":"NTLM"');
  expect(all).not.toMatch(/TlRMTVNT|YIIB/);
});

/**
 * A test scheme in the shape of NTLM: connection-bound, its first message sent to a bare challenge, then one per
 * challenge with a token, `steps` messages in all.
 */
function twoStep(steps = 2, delayMs = 0): ProxyAuthScheme {
  return {
    name: 'Twostep',
    strength: 30,
    connectionBound: true,
    preemptive: false,
    can: () => ({ ok: true, why: 'test' }),
    accepts: () => true,
    start() {
      let step = 0;
      return {
        respond: async () => {
          if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
          return step < steps ? `Twostep step${++step}` : undefined;
        },
      };
    },
  };
}
