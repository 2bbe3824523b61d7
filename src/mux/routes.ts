/**
 * The multiplexer's routing decision: which route takes a connection, given what sniffing and the ClientHello
 * said. Pure. The multiplexer knows no protocol by name: its caller hands it a list of routes, each with what it
 * matches (as Teleport's ALPN router takes `{MatchFunc, Handler}` pairs), and this file decides between them:
 *
 *   not TLS   the route whose `sniffed` kind is what the first bytes were ("ssh", "http")
 *   TLS       a route matching the server name by prefix, first (a server name names a service more precisely
 *             than an ALPN list, which clients fill with generic names such as h2)
 *             else the client's ALPN list in the client's order: the first protocol that a route lists wins,
 *             with that route's `ping` for it
 *             else, when the client offers no ALPN at all, the route that says `noAlpn`
 *             else none (the caller refuses the connection)
 *
 * A connection upgrade that names its route up front may go to that route only; the transport upgrade names none
 * and is routed by these rules, as a connection on the port.
 *
 * A protocol or a server-name prefix claimed by two routes, or two routes of one name, are refused when the table
 * is built: the answer would depend on the order of the list.
 */
import { GatewayError } from '../errors.js';

/** The sniffed kinds a route may take (sniff.ts): the PROXY headers are the multiplexer's own. */
export type SniffedRoute = 'ssh' | 'http' | 'gwdata' | 'gwe2e';

/** One ALPN protocol a route takes; `ping`: the client asks for keep-alive pings inside the stream. */
export interface AlpnProtocol {
  protocol: string;
  ping?: boolean;
}

/** Which connections a route takes. */
export type RouteMatch =
  /** Not TLS: SSH's identification line, an HTTP request line, or a magic line of end-to-end streams. */
  | { sniffed: SniffedRoute }
  /** TLS whose server name starts with this prefix, whatever its ALPN. */
  | { serverNamePrefix: string }
  /** TLS offering one of these ALPN protocols; with noAlpn, also TLS offering none. */
  | { alpn: readonly AlpnProtocol[]; noAlpn?: boolean };

export interface Route<H> {
  /** The route's name: ConnInfo.route, the multiplexer's counters, what a connection upgrade names. */
  name: string;
  match: RouteMatch;
  handler: H;
}

/** What a TLS route took from the hello: the ALPN protocol it matched (none for server-name and no-ALPN routes). */
export interface TlsChoice<H> {
  route: Route<H>;
  alpn?: string;
  ping?: boolean;
}

export class RouteTable<H> {
  private readonly sniffed = new Map<string, Route<H>>();
  private readonly byServerName: Array<{ prefix: string; route: Route<H> }> = [];
  private readonly byAlpn = new Map<string, { route: Route<H>; ping: boolean }>();
  private noAlpn: Route<H> | undefined;

  constructor(routes: readonly Route<H>[]) {
    const names = new Set<string>();
    for (const route of routes) {
      if (names.has(route.name)) throw conflict(`two routes are named "${route.name}"`);
      names.add(route.name);
      this.add(route);
    }
  }

  private add(route: Route<H>): void {
    const m = route.match;
    if ('sniffed' in m) {
      if (this.sniffed.has(m.sniffed)) throw conflict(`two routes take sniffed ${m.sniffed}`);
      this.sniffed.set(m.sniffed, route);
    } else if ('serverNamePrefix' in m) {
      if (this.byServerName.some((s) => s.prefix.startsWith(m.serverNamePrefix) || m.serverNamePrefix.startsWith(s.prefix))) {
        throw conflict(`two routes take server names starting with ${m.serverNamePrefix}`);
      }
      this.byServerName.push({ prefix: m.serverNamePrefix, route });
    } else {
      for (const { protocol, ping } of m.alpn) {
        if (this.byAlpn.has(protocol)) throw conflict(`two routes take ALPN ${protocol}`);
        this.byAlpn.set(protocol, { route, ping: ping === true });
      }
      if (m.noAlpn) {
        if (this.noAlpn) throw conflict('two routes take TLS without ALPN');
        this.noAlpn = route;
      }
    }
  }

  /** Every ALPN protocol some route takes, in the order the routes list them. */
  alpnProtocols(): string[] {
    return [...this.byAlpn.keys()];
  }

  /** The route for a non-TLS protocol; `only`: the route a connection upgrade named. */
  forSniffed(kind: SniffedRoute, only?: string): Route<H> | undefined {
    const route = this.sniffed.get(kind);
    return route && (only === undefined || route.name === only) ? route : undefined;
  }

  /** The route for a ClientHello (rules at the top of this file); `only`: the route a connection upgrade named. */
  forHello(hello: { serverName?: string | undefined; alpn: readonly string[] }, only?: string): TlsChoice<H> | undefined {
    const allowed = (route: Route<H>) => only === undefined || route.name === only;
    const { serverName } = hello;
    if (serverName !== undefined) {
      const byName = this.byServerName.find((s) => serverName.startsWith(s.prefix) && allowed(s.route));
      if (byName) return { route: byName.route };
    }
    for (const offered of hello.alpn) {
      const hit = this.byAlpn.get(offered);
      if (hit && allowed(hit.route)) return { route: hit.route, alpn: offered, ping: hit.ping };
    }
    if (hello.alpn.length === 0 && this.noAlpn && allowed(this.noAlpn)) return { route: this.noAlpn };
    return undefined;
  }
}

function conflict(what: string): GatewayError {
  return new GatewayError('GW_ERR_INTERNAL', `the multiplexer's routes conflict: ${what}`);
}
