/**
 * gwsh's side of reaching a resource through the Proxy: TLS to the Proxy (its certificate from the cluster's host
 * CA with the role proxy, src/client/api.ts proxyServerIdentity) with the protocol's ALPN and the user's certificate (through the Dialer, so through HTTPS_PROXY), one route header line naming the resource,
 * and one answer line from the Proxy: then the stream is the resource's.
 *
 * With TLS routing everything goes to the web address; with separate listeners databases use their own ports
 * (from /webapi/ping, routeAddress) and apps and desktops still use gateway-tcp on the web port.
 */
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { parseAddr } from '../addr.js';
import { Dialer } from '../dial/dialer.js';
import { tlsVerifyError, UNTRUSTED_HINTS } from '../dial/tlsverify.js';
import { GatewayError, isErrorCode, toGatewayError } from '../errors.js';
import { decisionAttributes } from '../dial/select.js';
import { envTraceContext, startHop, traceFields, tracingEnabled, type TraceContext } from '../trace.js';
import { PING_PATH, type PingResponse } from '../wire/ping.js';
import { FramedStream } from '../stream/framed.js';
import { readJsonLine, writeJsonLine } from '../stream/lines.js';
import { connectClusterTls } from '../dial/fallback.js';
import type { DialAnswer } from '../tunnel/protocol.js';
import { wireRowOfAlpn } from '../wire/protocols.js';
import { ApiClient, proxyServerIdentity } from './api.js';
import type { Profile } from './profile.js';

export interface ResourceTarget {
  /** ALPN route: gateway-postgres, ..., gateway-tcp. */
  alpn: string;
  resource: string;
  kind?: 'app' | 'desktop';
  /** gateway-proxy-ssh: the OS login. */
  login?: string;
  /** Ask the Proxy whether access would be allowed, without reaching the resource (the stream then ends). */
  check?: boolean;
  /** The trace this connection belongs to; default: TRACEPARENT of the environment, else a new trace. */
  trace?: TraceContext;
}

export async function fetchPing(profile: Profile, dialer: Dialer): Promise<PingResponse> {
  return new ApiClient({ address: profile.proxy, dialer, ca: profile.hostCa }).call<PingResponse>('GET', PING_PATH);
}

/**
 * Where a route's connections go: the web address with TLS routing, else a database route's own address (its row's
 * ping field, src/wire/protocols.ts); every other route uses the web address in both modes.
 */
export function routeAddress(profile: Profile, ping: PingResponse, alpn: string): string {
  if (ping.proxy.tls_routing_enabled) return profile.proxy;
  const field = wireRowOfAlpn(alpn)?.pingDb?.public;
  return (field && (ping.proxy.db as Record<string, string | undefined>)[field]) || profile.proxy;
}

/**
 * The profile's trust and certificate as one TLS context, for a caller that opens many connections (gwsh proxy
 * app|db): parsing the CA, the certificate and the key again for every connection costs about a millisecond.
 */
export function resourceTlsContext(profile: Profile): tls.SecureContext {
  return tls.createSecureContext({ ca: profile.hostCa, cert: profile.cert, key: profile.key });
}

export async function openResource(
  profile: Profile,
  address: string,
  target: ResourceTarget,
  dialer: Dialer = new Dialer(),
  secureContext?: tls.SecureContext,
): Promise<Duplex> {
  // The client's hop (src/trace.ts): the route and the Dialer's decision for the Proxy's address; its context
  // goes to the Proxy in the route header.
  const hop = startHop('gwsh.connect', {
    kind: 'client',
    parent: target.trace ?? envTraceContext(),
    trusted: true,
    ...(tracingEnabled() ? { attributes: { 'gateway.route': target.alpn, 'gateway.resource': target.resource, ...decisionAttributes(dialer.plan(address)) } } : {}),
  });
  try {
    return await openTraced(profile, address, target, dialer, secureContext, hop.context);
  } catch (err) {
    hop.fail(toGatewayError(err).code);
    throw err;
  } finally {
    hop.end();
  }
}

async function openTraced(profile: Profile, address: string, target: ResourceTarget, dialer: Dialer, secureContext: tls.SecureContext | undefined, trace: TraceContext | undefined): Promise<Duplex> {
  const host = parseAddr(address).host;
  const credentials = secureContext ? { secureContext } : { ca: profile.hostCa, cert: profile.cert, key: profile.key };
  // The Proxy's certificate must say role proxy: an agent's host certificate chains to the same CA. Past a
  // TLS-inspecting proxy, inside the upgrade on the web address (src/dial/fallback.ts decides).
  const tlsOptions = { ALPNProtocols: [target.alpn], ...credentials, host, checkServerIdentity: proxyServerIdentity };
  const peer = { server: 'proxy' as const, untrustedHint: UNTRUSTED_HINTS.clusterCa(address) };
  const socket = await connectClusterTls(dialer, address, tlsOptions, { peer, clusterCa: profile.hostCa, webAddress: profile.proxy }).catch((err: Error) => {
    throw (
      tlsVerifyError(err, { address, server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) }) ??
      (/alert/i.test(err.message) ? new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `the Proxy at ${address} does not serve ${target.alpn}: ${err.message}`) : err)
    );
  });
  writeJsonLine(socket, {
    resource: target.resource,
    ...(target.kind ? { kind: target.kind } : {}),
    ...(target.login ? { login: target.login } : {}),
    // Framed (src/stream/framed.ts): the Proxy's end of the bytes is said in the stream, so that a Proxy that dies
    // (its kernel sends a FIN, which TLS in Node reports as an end) is a break here, not a complete transfer.
    ...(target.check ? { check: true } : { framed: true }),
    ...traceFields(trace),
  });
  const answer = await readJsonLine<DialAnswer>(socket, { what: "the Proxy's answer", timeoutMs: 60_000 });
  if (!answer.ok) {
    socket.destroy();
    const code = isErrorCode(answer.error.code) ? answer.error.code : 'GW_ERR_TUNNEL_DIAL_FAILED';
    throw new GatewayError(code, answer.error.message);
  }
  // A Proxy of an earlier version ignores `framed` and answers without it: the bytes then come as they are.
  return answer.framed === true ? new FramedStream(socket) : socket;
}
