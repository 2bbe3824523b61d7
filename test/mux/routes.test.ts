/**
 * The multiplexer's routing decision (src/mux/routes.ts), pure: which route a sniffed protocol or a ClientHello
 * goes to, given a list of routes, and which lists are refused because their answer would depend on the order.
 */
import { describe, expect, it } from 'vitest';
import { isGatewayError } from '../../src/errors.js';
import { RouteTable, type Route } from '../../src/mux/routes.js';

const r = (name: string, match: Route<string>['match']): Route<string> => ({ name, match, handler: `handler of ${name}` });

const ROUTES: Route<string>[] = [
  r('web', { alpn: [{ protocol: 'http/1.1' }, { protocol: 'h2' }], noAlpn: true }),
  r('ssh', { sniffed: 'ssh' }),
  r('db', { alpn: [{ protocol: 'db' }, { protocol: 'db-ping', ping: true }] }),
  r('other', { alpn: [{ protocol: 'other' }] }),
  r('kube', { serverNamePrefix: 'kube.' }),
];
const table = new RouteTable(ROUTES);
const pick = (hello: { serverName?: string; alpn: string[] }, only?: string) => {
  const choice = table.forHello(hello, only);
  return choice && { route: choice.route.name, alpn: choice.alpn, ping: choice.ping };
};

describe('TLS: the route for a ClientHello', () => {
  it('the first protocol the client offers that a route takes wins, whatever the order of the routes', () => {
    expect(pick({ alpn: ['unknown', 'other', 'db'] })).toEqual({ route: 'other', alpn: 'other', ping: false });
    expect(pick({ alpn: ['db', 'other'] })).toEqual({ route: 'db', alpn: 'db', ping: false });
    expect(pick({ alpn: ['h2', 'db'] })).toEqual({ route: 'web', alpn: 'h2', ping: false });
  });

  it('a ping variant goes to its route with ping set, the protocol kept as offered', () => {
    expect(pick({ alpn: ['db-ping'] })).toEqual({ route: 'db', alpn: 'db-ping', ping: true });
    expect(pick({ alpn: ['other-ping'] })).toBeUndefined();
  });

  it('a server-name route wins over any ALPN, and takes no ALPN of its own', () => {
    expect(pick({ serverName: 'kube.proxy.test', alpn: ['h2', 'db'] })).toEqual({ route: 'kube', alpn: undefined, ping: undefined });
    expect(pick({ serverName: 'kube.proxy.test', alpn: [] })).toEqual({ route: 'kube', alpn: undefined, ping: undefined });
    // A prefix, not a substring.
    expect(pick({ serverName: 'not-kube.proxy.test', alpn: ['db'] })?.route).toBe('db');
  });

  it('no ALPN at all goes to the no-ALPN route; ALPNs none of which is taken go nowhere', () => {
    expect(pick({ alpn: [] })).toEqual({ route: 'web', alpn: undefined, ping: undefined });
    expect(pick({ serverName: 'proxy.test', alpn: ['unknown', 'db-pong'] })).toBeUndefined();
  });

  it('a connection upgrade names its route: only that route may take it', () => {
    expect(pick({ alpn: ['other', 'db-ping'] }, 'db')).toEqual({ route: 'db', alpn: 'db-ping', ping: true });
    expect(pick({ alpn: ['other'] }, 'db')).toBeUndefined();
    expect(pick({ serverName: 'kube.proxy.test', alpn: ['db'] }, 'db')?.route).toBe('db');
    expect(pick({ serverName: 'kube.proxy.test', alpn: ['h2'] }, 'db')).toBeUndefined();
    expect(pick({ alpn: [] }, 'db')).toBeUndefined();
  });

  it('every ALPN protocol the routes take is listed, ping variants included', () => {
    expect(table.alpnProtocols()).toEqual(['http/1.1', 'h2', 'db', 'db-ping', 'other']);
  });
});

describe('not TLS: the route for the first bytes', () => {
  it('the route that takes the sniffed kind, unless an upgrade named another', () => {
    expect(table.forSniffed('ssh')?.name).toBe('ssh');
    expect(table.forSniffed('ssh', 'db')).toBeUndefined();
    expect(table.forSniffed('http')).toBeUndefined();
  });
});

describe('lists whose answer would depend on their order are refused', () => {
  it.each<[string, Route<string>[]]>([
    ['two routes of one name', [r('a', { alpn: [{ protocol: 'x' }] }), r('a', { alpn: [{ protocol: 'y' }] })]],
    ['one ALPN protocol in two routes', [r('a', { alpn: [{ protocol: 'x' }] }), r('b', { alpn: [{ protocol: 'y' }, { protocol: 'x', ping: true }] })]],
    ['two no-ALPN routes', [r('a', { alpn: [], noAlpn: true }), r('b', { alpn: [], noAlpn: true })]],
    ['one sniffed kind in two routes', [r('a', { sniffed: 'ssh' }), r('b', { sniffed: 'ssh' })]],
    ['a server-name prefix inside another', [r('a', { serverNamePrefix: 'kube.' }), r('b', { serverNamePrefix: 'kube.eu.' })]],
  ])('%s', (_what, routes) => {
    let thrown: unknown;
    try {
      new RouteTable(routes);
    } catch (err) {
      thrown = err;
    }
    expect(isGatewayError(thrown, 'GW_ERR_INTERNAL')).toBe(true);
  });
});
