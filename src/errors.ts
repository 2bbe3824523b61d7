/**
 * One error family for the whole gateway. Every failure a user can meet has a stable code
 * (GW_ERR_<AREA>_<WHAT>), a one-line summary and a default hint; all three are listed in docs/errors.md
 * (a test fails when a code is missing there). Tests assert codes, never messages.
 */

export interface ErrorSpec {
  /** What the code means, for docs/errors.md. */
  readonly summary: string;
  /** What the user can do about it; an error may carry a more specific hint of its own. */
  readonly hint: string;
}

export const ERROR_CODES = {
  // --- generic -----------------------------------------------------------------------------------------------
  GW_ERR_INTERNAL: {
    summary: 'An unexpected failure inside the gateway.',
    hint: 'Run again with --debug and report the stack trace.',
  },
  GW_ERR_USAGE: {
    summary: 'A command line that the CLI cannot understand (unknown flag, missing argument).',
    hint: 'Run the command with --help to see its usage.',
  },

  // --- configuration -------------------------------------------------------------------------------------------
  GW_ERR_CONFIG_READ: {
    summary: 'The configuration file cannot be read.',
    hint: 'Check the path given with -c and that the file is readable by this user.',
  },
  GW_ERR_CONFIG_SYNTAX: {
    summary: 'The configuration file is not valid YAML.',
    hint: 'Fix the YAML syntax at the line and column shown.',
  },
  GW_ERR_CONFIG_DUPLICATE_KEY: {
    summary: 'A key appears twice in the same mapping of the configuration file.',
    hint: 'Keep one of the two; YAML does not allow a key twice in one mapping.',
  },
  GW_ERR_CONFIG_UNKNOWN_KEY: {
    summary: 'The configuration has a key the gateway does not know.',
    hint: 'Remove the key or correct its spelling; `gateway configure` prints every known key.',
  },
  GW_ERR_CONFIG_TYPE: {
    summary: 'A configuration value has the wrong type (a list where a string is expected, and so on).',
    hint: 'Give the value the type shown in docs/configuration.md.',
  },
  GW_ERR_CONFIG_VALUE: {
    summary: 'A configuration value has the right type but is not allowed (bad enum value, bad version, bad URL).',
    hint: 'Use one of the values listed in docs/configuration.md.',
  },
  GW_ERR_CONFIG_ADDR: {
    summary: 'A configuration address is not a valid host, host:port or IP literal.',
    hint: 'Write addresses as host:port, an IP or a DNS name; IPv6 with a port goes in brackets: [2001:db8::1]:443.',
  },
  GW_ERR_CONFIG_CHANNEL: {
    summary: 'An automatic-upgrades channel sets both or neither of static_version and forward_url.',
    hint: 'Give each channel exactly one of static_version (e.g. v17.0.1) or forward_url (an http(s) URL).',
  },

  // --- proxy selection from the environment ----------------------------------------------------------------------
  GW_ERR_DIAL_PROXY_ENV: {
    summary: 'HTTPS_PROXY / HTTP_PROXY (or their lowercase forms) hold a value that is not a usable proxy URL.',
    hint: 'Use scheme://[user[:password]@]host:port with scheme http or https, or a bare host:port.',
  },
  GW_ERR_DIAL_PROXY_LOOPBACK: {
    summary: 'The proxy host in HTTPS_PROXY / HTTP_PROXY is localhost or 127.0.0.1, which the gateway refuses.',
    hint: "Use the proxy's DNS name or a private IP address instead of localhost / 127.0.0.1.",
  },
  GW_ERR_DIAL_BAD_TARGET: {
    summary: 'A dial target is neither host:port nor an http:// or https:// URL.',
    hint: 'Give targets as host:port (IPv6 in brackets: [2001:db8::1]:443) or as http(s):// URLs.',
  },

  // --- dialing ----------------------------------------------------------------------------------------------------
  GW_ERR_DIAL_UNREACHABLE: {
    summary: 'A direct connection to the target failed (refused, no route, name not found).',
    hint: 'Check the address and that the service listens there; if the network needs a proxy, set HTTPS_PROXY.',
  },
  GW_ERR_DIAL_PROXY_UNREACHABLE: {
    summary: 'The HTTP CONNECT proxy itself cannot be reached (refused, no route, name not found).',
    hint: 'Check the host and port in HTTPS_PROXY / HTTP_PROXY and that the proxy is running.',
  },
  GW_ERR_DIAL_CONNECT_TIMEOUT: {
    summary: 'The TCP (and, for an https:// proxy, TLS) connection to the proxy or target did not complete in time.',
    hint: 'Check that the address is reachable from this host; a firewall that drops packets looks like this.',
  },
  GW_ERR_DIAL_PROXY_TLS: {
    summary: 'The TLS handshake with an https:// proxy failed (certificate not trusted, wrong name, protocol error).',
    hint: "Give the proxy's CA with --proxy-ca / dialer option proxyCa, or check the proxy's TLS configuration.",
  },
  GW_ERR_DIAL_PROXY_NO_ANSWER: {
    summary: 'The proxy accepted the connection but did not answer the CONNECT request in time.',
    hint: 'The proxy may be overloaded or not an HTTP proxy at all; check the port in HTTPS_PROXY.',
  },
  GW_ERR_DIAL_PROXY_CLOSED: {
    summary: 'The proxy closed the connection before it finished answering the CONNECT request.',
    hint: "Check the proxy's logs; it may refuse clients from this address or limit connections.",
  },
  GW_ERR_DIAL_PROXY_MALFORMED: {
    summary: 'The proxy answered the CONNECT request with something that is not an HTTP response.',
    hint: 'The address in HTTPS_PROXY may point at a service that is not an HTTP proxy.',
  },
  GW_ERR_DIAL_PROXY_REFUSED: {
    summary: 'The proxy answered CONNECT with an error status (403, 502, 503, ...).',
    hint: "Check the proxy's access rules for this target; many proxies allow CONNECT only to port 443.",
  },
  GW_ERR_DIAL_PROXY_AUTH_REQUIRED: {
    summary: 'The proxy requires authentication (407) and no credentials were given.',
    hint: 'Put the credentials in the proxy URL: http://user:password@host:port (percent-encode special characters).',
  },
  GW_ERR_DIAL_PROXY_AUTH_REFUSED: {
    summary: 'The proxy refused the credentials in the proxy URL (407).',
    hint: 'Check the user name and password in HTTPS_PROXY / HTTP_PROXY (percent-encode special characters).',
  },
  GW_ERR_HTTP_FAILED: {
    summary: 'An HTTPS request made through the Dialer failed after the connection was set up (TLS or HTTP error).',
    hint: "Check the server's certificate and address; the message names the URL.",
  },
  GW_ERR_HTTP_TIMEOUT: {
    summary: 'An HTTPS request made through the Dialer got no answer in time.',
    hint: 'Check that the server is up and reachable through the proxy, if one is set.',
  },
  GW_ERR_HTTP_TOO_LARGE: {
    summary: 'An HTTPS answer was larger than the gateway accepts for that request.',
    hint: 'The URL probably points at the wrong resource.',
  },
  GW_ERR_DIAL_ABORTED: {
    summary: 'The dial was cancelled by the caller before it completed.',
    hint: 'Nothing to fix: the operation that needed the connection was stopped.',
  },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERROR_CODES;

export interface GatewayErrorOptions {
  hint?: string;
  cause?: unknown;
  /** Machine-readable facts (never secrets): key path, line, proxy URL with the password redacted, ... */
  details?: Record<string, unknown>;
}

export class GatewayError extends Error {
  readonly code: ErrorCode;
  readonly hint: string;
  readonly details: Readonly<Record<string, unknown>>;

  constructor(code: ErrorCode, message: string, options: GatewayErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'GatewayError';
    this.code = code;
    this.hint = options.hint ?? ERROR_CODES[code].hint;
    this.details = Object.freeze({ ...(options.details ?? {}) });
  }

  toJSON(): { code: ErrorCode; message: string; hint: string } {
    return { code: this.code, message: this.message, hint: this.hint };
  }
}

export function isGatewayError(err: unknown, code?: ErrorCode): err is GatewayError {
  return err instanceof GatewayError && (code === undefined || err.code === code);
}

/** Wraps anything thrown into a GatewayError, keeping the original as the cause. */
export function toGatewayError(err: unknown): GatewayError {
  if (err instanceof GatewayError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new GatewayError('GW_ERR_INTERNAL', message, { cause: err });
}
