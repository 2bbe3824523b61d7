/**
 * One error family for the whole gateway. Every failure a user can meet has a stable code
 * (GW_ERR_<AREA>_<WHAT>), the HTTP status it is answered with, a one-line summary and a default hint; all four are
 * listed in docs/errors.md (a test fails when a code is missing there or its status differs). Tests assert codes,
 * never messages.
 *
 * The status is the code's, not the route's: every HTTP answer of the gateway (the Auth API, the Proxy's web routes,
 * the version server, peering, the forwarder) takes it from here (httpStatus), so one code is one status everywhere.
 * A code that only a client or a CLI raises has one too, saying what it would mean as an answer: 5xx for a fault of
 * this side or of what it stands on (500), of a server behind it (502), or of one that did not answer in time (504).
 */

/** The HTTP statuses an error is answered with. */
export type HttpErrorStatus = 400 | 401 | 403 | 404 | 405 | 409 | 413 | 426 | 429 | 500 | 502 | 503 | 504;

export interface ErrorSpec {
  /** The HTTP status of an answer carrying this code. */
  readonly status: HttpErrorStatus;
  /** What the code means, for docs/errors.md. */
  readonly summary: string;
  /** What the user can do about it; an error may carry a more specific hint of its own. */
  readonly hint: string;
}

export const ERROR_CODES = {
  // --- generic -----------------------------------------------------------------------------------------------
  GW_ERR_INTERNAL: {
    status: 500,
    summary: 'An unexpected failure inside the gateway.',
    hint: 'Run again with --debug and report the stack trace.',
  },
  GW_ERR_USAGE: {
    status: 400,
    summary: 'A command line that the CLI cannot understand (unknown flag, missing argument).',
    hint: 'Run the command with --help to see its usage.',
  },
  GW_ERR_OUTPUT_FORMAT: {
    status: 400,
    summary: 'An output format (--format, -f) that the CLIs do not print; they print text, json and yaml.',
    hint: 'Give -f text, -f json or -f yaml.',
  },

  // --- configuration -------------------------------------------------------------------------------------------
  GW_ERR_CONFIG_READ: {
    status: 500,
    summary: 'The configuration file cannot be read.',
    hint: 'Check the path given with -c and that the file is readable by this user.',
  },
  GW_ERR_CONFIG_SYNTAX: {
    status: 500,
    summary: 'The configuration file is not valid YAML.',
    hint: 'Fix the YAML syntax at the line and column shown.',
  },
  GW_ERR_CONFIG_DUPLICATE_KEY: {
    status: 500,
    summary: 'A key appears twice in the same mapping of the configuration file.',
    hint: 'Keep one of the two; YAML does not allow a key twice in one mapping.',
  },
  GW_ERR_CONFIG_UNKNOWN_KEY: {
    status: 500,
    summary: 'The configuration has a key the gateway does not know.',
    hint: 'Remove the key or correct its spelling; `gateway configure` prints every known key.',
  },
  GW_ERR_CONFIG_TYPE: {
    status: 500,
    summary: 'A configuration value has the wrong type (a list where a string is expected, and so on).',
    hint: 'Give the value the type shown in docs/configuration.md.',
  },
  GW_ERR_CONFIG_VALUE: {
    status: 500,
    summary: 'A configuration value has the right type but is not allowed (bad enum value, bad version, bad URL).',
    hint: 'Use one of the values listed in docs/configuration.md.',
  },
  GW_ERR_CONFIG_ADDR: {
    status: 500,
    summary: 'A configuration address is not a valid host, host:port or IP literal.',
    hint: 'Write addresses as host:port, an IP or a DNS name, without a scheme (gw.example.com:443, not https://gw.example.com); IPv6 with a port goes in brackets: [2001:db8::1]:443.',
  },
  GW_ERR_CONFIG_CHANNEL: {
    status: 500,
    summary: 'An automatic-upgrades channel sets both or neither of static_version and forward_url.',
    hint: 'Give each channel exactly one of static_version (e.g. v17.0.1) or forward_url (an http(s) URL).',
  },

  // --- proxy selection from the environment ----------------------------------------------------------------------
  GW_ERR_DIAL_PROXY_ENV: {
    status: 500,
    summary: 'HTTPS_PROXY / HTTP_PROXY / ALL_PROXY (or their lowercase forms) hold a value that is not a usable proxy URL.',
    hint: 'Use scheme://[user[:password]@]host:port with scheme http, https, socks5 or socks5h, or a bare host:port.',
  },
  GW_ERR_DIAL_PROXY_LOOPBACK: {
    status: 500,
    summary: 'The proxy host in HTTPS_PROXY / HTTP_PROXY / ALL_PROXY is localhost or 127.0.0.1, which the gateway refuses.',
    hint: "Use the proxy's DNS name or a private IP address instead of localhost / 127.0.0.1.",
  },
  GW_ERR_DIAL_BAD_TARGET: {
    status: 500,
    summary: 'A dial target is neither host:port nor an http:// or https:// URL.',
    hint: 'Give targets as host:port (IPv6 in brackets: [2001:db8::1]:443) or as http(s):// URLs.',
  },

  // --- dialing ----------------------------------------------------------------------------------------------------
  GW_ERR_DIAL_UNREACHABLE: {
    status: 502,
    summary: 'A direct connection to the target failed (refused, no route, name not found).',
    hint: 'Check the address and that the service listens there; if the network needs a proxy, set HTTPS_PROXY.',
  },
  GW_ERR_DIAL_PROXY_UNREACHABLE: {
    status: 502,
    summary: 'The proxy itself (HTTP CONNECT or SOCKS5) cannot be reached (refused, no route, name not found).',
    hint: 'Check the host and port in HTTPS_PROXY / HTTP_PROXY / ALL_PROXY and that the proxy is running.',
  },
  GW_ERR_DIAL_CONNECT_TIMEOUT: {
    status: 504,
    summary: 'The TCP (and, for an https:// proxy, TLS) connection to the proxy or target did not complete in time.',
    hint: 'Check that the address is reachable from this host; a firewall that drops packets looks like this.',
  },
  GW_ERR_DIAL_PROXY_TLS: {
    status: 502,
    summary: 'The TLS handshake with an https:// proxy failed (certificate not trusted, wrong name, protocol error).',
    hint: "Give the proxy's CA with --proxy-ca / dialer option proxyCa, or check the proxy's TLS configuration.",
  },
  GW_ERR_DIAL_PROXY_NO_ANSWER: {
    status: 504,
    summary: 'The proxy accepted the connection but did not answer the CONNECT request in time.',
    hint: 'The proxy may be overloaded or not an HTTP proxy at all; check the port in HTTPS_PROXY.',
  },
  GW_ERR_DIAL_PROXY_CLOSED: {
    status: 502,
    summary: 'The proxy closed the connection before it finished answering the CONNECT request.',
    hint: "Check the proxy's logs; it may refuse clients from this address or limit connections.",
  },
  GW_ERR_DIAL_PROXY_MALFORMED: {
    status: 502,
    summary: 'The proxy answered the CONNECT request with something that is not an HTTP response.',
    hint: 'The address in HTTPS_PROXY may point at a service that is not an HTTP proxy.',
  },
  GW_ERR_DIAL_PROXY_REFUSED: {
    status: 502,
    summary: 'The proxy refused the CONNECT request with an error status other than 502, 503 or 504 (403 forbidden, 400, ...): its rules do not let this client reach this target.',
    hint: "Check the proxy's access rules for this target; many proxies allow CONNECT only to port 443.",
  },
  GW_ERR_DIAL_PROXY_TARGET_UNREACHABLE: {
    status: 502,
    summary: 'The proxy was reached and accepted the CONNECT request, but could not reach the target itself (it answered 502, 503 or 504: connection refused, name not found, timed out).',
    hint: "Check that the target the message names is up and listening on that port, that the proxy can resolve its name (the proxy's DNS), and that the proxy's own outbound firewall lets it reach that port.",
  },
  GW_ERR_DIAL_PROXY_AUTH_REQUIRED: {
    status: 502,
    summary: 'The proxy requires authentication (407) and no credentials were given.',
    hint: 'Put the credentials in the proxy URL: http://user:password@host:port (percent-encode special characters; NTLM: http://DOMAIN%5Cuser:password@host:port). For Negotiate (Kerberos) get a ticket with kinit, or set KRB5_CLIENT_KTNAME to a keytab.',
  },
  GW_ERR_DIAL_PROXY_AUTH_REFUSED: {
    status: 502,
    summary: 'The proxy refused the credentials it was answered with (407 again after the answer: the URL\'s password, or the Kerberos ticket), stopped offering the scheme they were answered with, or closed the connection in the middle of a handshake bound to it (NTLM, Negotiate) twice.',
    hint: 'Check the user name and password in HTTPS_PROXY / HTTP_PROXY (percent-encode special characters; NTLM: DOMAIN%5Cuser) against the realm the proxy names; for Negotiate, check with klist that the ticket is from the realm the proxy trusts, and that the proxy has the key of HTTP/<its host name> in its keytab.',
  },
  GW_ERR_DIAL_PROXY_AUTH_UNSUPPORTED: {
    status: 502,
    summary: 'The proxy asked for authentication (407) with no scheme this client can answer; the message lists what it offered.',
    hint: "Basic, Digest and NTLM need user:password in the proxy URL (NTLM: DOMAIN%5Cuser), Negotiate a Kerberos ticket (kinit, or KRB5_CLIENT_KTNAME); for a scheme the message says is unknown, ask for one of those to be enabled.",
  },
  GW_ERR_DIAL_PROXY_AUTH_LOOP: {
    status: 502,
    summary: 'The proxy kept answering 407 to the same dial after as many answers as any scheme needs.',
    hint: "The proxy is misconfigured or rejects this client's answers without saying so; check its authentication log for the user.",
  },
  GW_ERR_DIAL_SOCKS_NO_ANSWER: {
    status: 504,
    summary: 'The SOCKS5 proxy accepted the TCP connection but did not finish its handshake in time.',
    hint: 'The address in the proxy variable may not be a SOCKS5 server (an HTTP proxy wants http://), or it is overloaded.',
  },
  GW_ERR_DIAL_SOCKS_CLOSED: {
    status: 502,
    summary: 'The SOCKS5 proxy closed the connection in the middle of its handshake.',
    hint: "Check the SOCKS server's log: it may refuse clients from this address (dante: client pass rules).",
  },
  GW_ERR_DIAL_SOCKS_MALFORMED: {
    status: 502,
    summary: 'The SOCKS5 proxy answered with bytes that are not SOCKS5 (wrong version, unknown address type, a method not offered).',
    hint: 'The address in the proxy variable may point at a service that is not a SOCKS5 server; for an HTTP proxy use http://.',
  },
  GW_ERR_DIAL_SOCKS_REFUSED: {
    status: 502,
    summary: 'The SOCKS5 proxy refused the CONNECT (its reply code: not allowed by ruleset, host unreachable, ...).',
    hint: "Check the SOCKS server's rules for this target; with socks5h:// the proxy resolves the name, so it must know it.",
  },
  GW_ERR_DIAL_SOCKS_AUTH_REQUIRED: {
    status: 502,
    summary: 'The SOCKS5 proxy requires authentication and the proxy URL has no user name.',
    hint: 'Put the credentials in the proxy URL: socks5h://user:password@host:port (percent-encode special characters).',
  },
  GW_ERR_DIAL_SOCKS_AUTH_REFUSED: {
    status: 502,
    summary: 'The SOCKS5 proxy refused the user name and password of the proxy URL, or accepts no method the gateway has.',
    hint: 'Check the user name and password in the proxy URL (percent-encode special characters).',
  },
  GW_ERR_DIAL_PAC_FETCH: {
    status: 502,
    summary: 'The PAC file named by pac+http(s):// or pac+file:// in HTTPS_PROXY / HTTP_PROXY could not be fetched (unreachable, not 200, over the size cap, too slow).',
    hint: 'Check that the PAC URL answers 200 with the file (curl it from this host); the gateway fetches it directly, never through a proxy.',
  },
  GW_ERR_DIAL_PAC_SCRIPT: {
    status: 502,
    summary: 'The PAC file is not valid JavaScript, throws, runs out of memory or defines no FindProxyForURL(url, host).',
    hint: 'Fix the PAC file at the line named in the message; test it with \'gateway dial-plan TARGET\'.',
  },
  GW_ERR_DIAL_PAC_TIMEOUT: {
    status: 504,
    summary: 'The PAC file\'s FindProxyForURL did not answer within its time bound (a loop, or DNS helpers that hang).',
    hint: 'Fix the loop in the PAC file, or make the names it resolves with dnsResolve / isInNet resolvable quickly from this host.',
  },
  GW_ERR_DIAL_PAC_ANSWER: {
    status: 502,
    summary: 'FindProxyForURL returned something that is not a list of DIRECT / PROXY / HTTPS / SOCKS entries.',
    hint: 'Make FindProxyForURL return entries like "PROXY host:port; DIRECT" (each proxy with its port).',
  },
  GW_ERR_DIAL_PAC_EXHAUSTED: {
    status: 502,
    summary: 'Every entry of the PAC file\'s answer failed (unreachable or timed out) or could not be used.',
    hint: 'Check the proxies the PAC names (gateway dial-plan TARGET shows them) and that they run; the message says why each entry failed.',
  },
  GW_ERR_DIAL_WPAD_NOT_FOUND: {
    status: 502,
    summary: 'WPAD discovery (GATEWAY_WPAD=1) found no wpad.dat at wpad.<domain> for the search domains of /etc/resolv.conf.',
    hint: 'Serve the PAC at http://wpad.<your domain>/wpad.dat, or set HTTPS_PROXY=pac+http://host/proxy.pac with its URL.',
  },
  GW_ERR_HTTP_FAILED: {
    status: 502,
    summary: 'An HTTPS request made through the Dialer failed after the connection was set up (TLS or HTTP error).',
    hint: "Check the server's certificate and address; the message names the URL.",
  },
  GW_ERR_HTTP_TIMEOUT: {
    status: 504,
    summary: 'An HTTPS request made through the Dialer got no answer in time.',
    hint: 'Check that the server is up and reachable through the proxy, if one is set.',
  },
  GW_ERR_HTTP_TOO_LARGE: {
    status: 502,
    summary: 'An HTTPS answer was larger than the gateway accepts for that request.',
    hint: 'The URL probably points at the wrong resource.',
  },
  GW_ERR_DIAL_ABORTED: {
    status: 500,
    summary: 'The dial was cancelled by the caller before it completed.',
    hint: 'Nothing to fix: the operation that needed the connection was stopped.',
  },

  // --- proxy authentication bound to one connection: NTLM, Negotiate (src/dial/auth/ntlm.ts, negotiate.ts) --------
  GW_ERR_DIAL_PROXY_NTLM_CHALLENGE: {
    status: 502,
    summary: "The proxy's NTLM challenge (its Type 2 message) is malformed, out of bounds, or not an NTLM challenge at all; nothing is answered to it.",
    hint: "Check the proxy's NTLM configuration (or what sits between it and this host), or give credentials for another scheme it offers.",
  },
  GW_ERR_DIAL_PROXY_NTLM_CREDENTIALS: {
    status: 500,
    summary: 'The NTLM credentials in the proxy URL cannot be used (no user name, or a user name, domain or password too long).',
    hint: 'Write them as http://DOMAIN%5Cuser:password@host:port (the backslash percent-encoded as %5C).',
  },
  GW_ERR_DIAL_PROXY_NEGOTIATE_UNAVAILABLE: {
    status: 500,
    summary: "The proxy asks for Negotiate (Kerberos) but this installation has no GSSAPI binding (the kerberos npm package, built against the system's libkrb5).",
    hint: "Install the system's Kerberos library and reinstall the gateway so its kerberos module is built (Debian: apt-get install libkrb5-dev, then reinstall; the .deb depends on libgssapi-krb5-2), or give credentials for another scheme the proxy offers (docs/dialing.md).",
  },
  GW_ERR_DIAL_PROXY_NEGOTIATE_FAILED: {
    status: 502,
    summary: "No Kerberos token could be made for the proxy's service principal (HTTP@ and the proxy's host name; no credentials cache or keytab, an expired ticket, no such principal, the KDC unreachable), or the proxy's answer token was refused by GSSAPI.",
    hint: "Run kinit (or set KRB5CCNAME to a credential cache, or KRB5_CLIENT_KTNAME to a keytab) and check that the proxy's service principal (HTTP/ and its host name) exists in the realm; the message carries GSSAPI's reason.",
  },

  // --- storage backend (src/backend) ------------------------------------------------------------------------------
  GW_ERR_BACKEND_OPEN: {
    status: 500,
    summary: 'The cluster-state backend cannot be opened (path is a directory, file is not a gateway database, permission denied, unsupported type; PostgreSQL: bad connection string, missing database, missing privilege, not UTF8, newer schema).',
    hint: 'Check that the backend path names a file in a directory this user can write, and that the file is a gateway backend (or move it aside).',
  },
  GW_ERR_BACKEND_CLOSED: {
    status: 500,
    summary: 'An operation was made on a backend after close().',
    hint: 'This is a bug in the caller: stop using the backend once it is closed, or open it again.',
  },
  GW_ERR_BACKEND_EXISTS: {
    status: 500,
    summary: 'create() found the key already present in the backend.',
    hint: 'Use update() or put() to change an existing item, or delete it first.',
  },
  GW_ERR_BACKEND_NOT_FOUND: {
    status: 500,
    summary: 'update() found no item at the key in the backend (it never existed, was deleted, or expired).',
    hint: 'Use create() or put() for a new item.',
  },
  GW_ERR_BACKEND_CONFLICT: {
    status: 500,
    summary: 'A compare-and-swap or a condition of an atomic write did not hold: the item changed, appeared or disappeared.',
    hint: 'Read the item again and retry the change on top of the current revision.',
  },
  GW_ERR_BACKEND_INVALID: {
    status: 500,
    summary: 'A backend call got an invalid argument (empty key, key or value with NUL or an unpaired surrogate, bad TTL, limit or revision).',
    hint: 'This is a bug in the caller: keys are non-empty well-formed strings of at most 1024 UTF-8 bytes, TTLs positive numbers of ms.',
  },
  GW_ERR_BACKEND_FAILED: {
    status: 500,
    summary: 'The backend failed an operation (disk full, I/O error, database locked by another process for too long, corrupted file; PostgreSQL: the write lock held too long by another Auth Service, a server error).',
    hint: 'Check free disk space and the health of the disk holding the backend; restore the file from a backup if it is corrupted.',
  },
  GW_ERR_BACKEND_UNREACHABLE: {
    status: 500,
    summary: "The backend's PostgreSQL server cannot be reached (connection refused, unknown host, timeout, no free connection slot), or the connection was lost during an operation.",
    hint: 'Check that PostgreSQL runs and listens at the address of gateway.storage.conn_string and that this machine can reach it. A write that failed this way may or may not have been applied: read the item again before retrying.',
  },
  GW_ERR_BACKEND_AUTH: {
    status: 500,
    summary: "PostgreSQL refused the backend's login: wrong password, no password given, no pg_hba.conf line for the user, or a client certificate that does not name the user.",
    hint: "Check the user and its password or client certificate (gateway.storage.cert_file, whose CN is the user name) against the server's pg_hba.conf.",
  },
  GW_ERR_BACKEND_TLS: {
    status: 500,
    summary: "TLS to the backend's PostgreSQL server failed: the server does not accept TLS, refused the client certificate, or the TLS files cannot be read or used.",
    hint: "Turn ssl on in the server's postgresql.conf, and check gateway.storage.ca_file, cert_file and key_file (a certificate the server's ssl_ca_file trusts and its key).",
  },
  GW_ERR_BACKEND_COMPACTED: {
    status: 500,
    summary: "A backend watcher fell behind the change log's trimmed horizon: events it had not received yet are gone (after a database outage longer than the log's retention).",
    hint: 'Read the state again with range() and watch again; the Auth Service does this by itself.',
  },

  // --- auth service, API, clients ----------------------------------------------------------------------------------
  GW_ERR_AUTH_CLUSTER_NAME: {
    status: 500,
    summary: 'The configured cluster name differs from the one stored in the data directory.',
    hint: 'A cluster cannot be renamed: set auth_service.cluster_name back, or start with a new data directory.',
  },
  GW_ERR_AUTH_UNAUTHENTICATED: {
    status: 401,
    summary: 'An API call that needs an identity came without a valid client certificate from this cluster.',
    hint: "Sign in with 'gwsh login', or run gwctl on the Auth Service's machine with its data directory.",
  },
  GW_ERR_ACCESS_DENIED: {
    status: 403,
    summary: "The caller's roles do not allow the action (or a deny rule forbids it); the message names the missing rule.",
    hint: 'Ask an administrator for a role with the missing rule, then sign out and in again.',
  },
  GW_ERR_ACCESS_LOCKED: {
    status: 403,
    summary: 'A lock refuses the identity: its user, one of its roles, or the agent is locked; the message names the lock, its message and until when.',
    hint: "An administrator lifts the lock with 'gwctl unlock NAME' ('gwctl get locks' lists them); a lock with an expiry ends by itself.",
  },
  GW_ERR_AUTH_IDENTITY_REVOKED: {
    status: 401,
    summary: 'The certificate names a user or an agent that no longer exists in this cluster (removed after the certificate was issued).',
    hint: 'A removed user must be created again and sign in again; a removed agent must join again with a new token.',
  },
  GW_ERR_AUTH_LOGIN_FAILED: {
    status: 401,
    summary: 'Wrong user name or password (the error does not say which).',
    hint: 'Check the user name and password; repeated failures are rate limited.',
  },
  GW_ERR_AUTH_RATE_LIMITED: {
    status: 429,
    summary: 'Too many failed (or still running) logins for this user from this address, or failed joins from this address; further attempts are refused until the window passes.',
    hint: 'Wait for the time shown, then try again with the right password or a valid join token.',
  },
  GW_ERR_AUDIT_RATE_LIMITED: {
    status: 429,
    summary: "A Proxy reported more session events in a minute than any Proxy's own bounds allow (PROXY_EVENTS_PER_MINUTE); the Auth Service refuses the rest of that minute's, from that Proxy only.",
    hint: "A Proxy of this version cannot send this many: look at that Proxy (gwctl get proxies) and lock it with 'gwctl lock --node <its host ID>' if it is not yours.",
  },
  GW_ERR_AUTH_WEAK_PASSWORD: {
    status: 400,
    summary: 'A new password is shorter than 8 or longer than 1024 characters.',
    hint: 'Choose a password of at least 8 characters.',
  },
  GW_ERR_AUTH_TOKEN_UNKNOWN: {
    status: 401,
    summary: 'The join token is not known to this cluster (mistyped, removed, or for another cluster).',
    hint: "Create a new one with 'gwctl tokens add' and copy it exactly.",
  },
  GW_ERR_AUTH_TOKEN_EXPIRED: {
    status: 401,
    summary: 'The join token has expired.',
    hint: "Create a new one with 'gwctl tokens add' (--ttl sets how long it lasts).",
  },
  GW_ERR_AUTH_TOKEN_USED: {
    status: 401,
    summary: 'The join token has been used as many times as it allows.',
    hint: "Create a new one with 'gwctl tokens add' (--uses sets how many agents may join with it).",
  },
  GW_ERR_AUTH_TOKEN_WRONG_TYPE: {
    status: 403,
    summary: 'The join token is for other service types than the agent asked to join as.',
    hint: "Create a token with the agent's types: gwctl tokens add --type=node,db,...",
  },
  GW_ERR_AUTH_JOIN_NAME_RESERVED: {
    status: 403,
    summary: "A join asked for a node name or public address that belongs to the cluster's Proxies or Auth Services (their public addresses and node names, the cluster name, or a name under a Proxy's public name, where apps are served); only a Proxy's token may name a Proxy's addresses.",
    hint: "Give the agent a name and public_addr of its own (gateway.nodename, the services' public_addr, --public-addr); the message names the reserved name and whose it is. The token was not used.",
  },
  GW_ERR_HOST_RENEW_REFUSED: {
    status: 403,
    summary: "An agent's renewal of its host certificates was refused: the key it sent is not the one it joined with, its node record holds no key, or an ask a Proxy carried lacks the agent's fresh proof of its key.",
    hint: "The message says which. A key that is not the joined one, or a record without one: join the agent again with a new token from 'gwctl tokens add' (renewal keeps the key). A missing or stale proof: check the agent's clock (date -u); it asks again by itself.",
  },
  GW_ERR_HOST_RENEW_TOO_SOON: {
    status: 429,
    summary: "An agent asked to renew its host certificates again within an hour of its last renewal, or within a minute of a refused ask the same way.",
    hint: 'Nothing to do: the agent keeps its current certificates and asks again later by itself.',
  },
  GW_ERR_AUTH_PIN_MISMATCH: {
    status: 502,
    summary: "The cluster CA presented by the server does not match the --ca-pin given; nothing secret was sent.",
    hint: "Check the pin ('gwctl status' prints it) and that the address is this cluster's Proxy.",
  },
  GW_ERR_RESOURCE_EXISTS: {
    status: 409,
    summary: 'The resource already exists.',
    hint: 'Use gwctl create -f to overwrite it, or choose another name.',
  },
  GW_ERR_RESOURCE_NOT_FOUND: {
    status: 404,
    summary: 'No resource (user, role, token, ...) by that name.',
    hint: "List what exists with 'gwctl get KIND'.",
  },
  GW_ERR_RESOURCE_KIND: {
    status: 400,
    summary: 'A resource kind that gwctl does not manage.',
    hint: 'Kinds: role, user, token, github, saml, oidc, cluster_maintenance_config, lock, autoupdate_config, autoupdate_version, autoupdate_agent_rollout, node, proxy, event (each also in the plural).',
  },
  GW_ERR_RESOURCE_INVALID: {
    status: 400,
    summary: 'A resource manifest does not validate (YAML syntax, unknown kind or version, unknown key, wrong type or value); details.problems lists every problem with its document, key path, line and column.',
    hint: 'Fix the key at the document, line and column shown; docs/resources.md lists every kind and field.',
  },
  GW_ERR_RESOURCE_DUPLICATE: {
    status: 400,
    summary: 'A manifest defines the same resource (kind and name) twice; reported as a problem inside GW_ERR_RESOURCE_INVALID.',
    hint: 'Keep one definition of each resource in a manifest.',
  },
  GW_ERR_APPLY_CONFLICT: {
    status: 409,
    summary: 'gwctl apply: a resource of the plan was changed by someone else between the plan and the write; the write was refused whole, nothing was applied.',
    hint: 'Run gwctl apply --dry-run again to see the new plan, then apply it.',
  },
  GW_ERR_APPLY_TOO_LARGE: {
    status: 413,
    summary: 'gwctl apply: the files are more than one apply takes (256 files, 1 MiB of text together, 1000 resources); nothing was read further or applied.',
    hint: 'Split the resources into several apply sets (--set NAME), each applied from its own directory.',
  },
  GW_ERR_APPLY_SOURCE: {
    status: 400,
    summary: 'gwctl apply -f: a file or directory cannot be read (missing, unreadable, a symlink loop, a directory without -R, no manifest found); nothing was applied.',
    hint: 'Give readable .yaml, .yml or .json files, or a directory holding them (-R to descend into subdirectories).',
  },
  GW_ERR_API_BAD_REQUEST: {
    status: 400,
    summary: 'An API request the server cannot understand (bad JSON, missing field, bad percent-encoding).',
    hint: 'Check that the client and the server run the same version.',
  },
  GW_ERR_API_METHOD_NOT_ALLOWED: {
    status: 405,
    summary: 'An API path the server has, asked with a method it does not take there (the answer\'s Allow header, when present, lists the ones it does).',
    hint: 'Check that the client and the server run the same version.',
  },
  GW_ERR_API_UPGRADE_REQUIRED: {
    status: 426,
    summary: "A plain request (no Upgrade: websocket) to the Proxy's connection-upgrade path, which only takes a WebSocket upgrade.",
    hint: 'Send GET /webapi/connectionupgrade with Upgrade: websocket and the ALPN protocol as the subprotocol (gwsh does when the web port is behind a load balancer that ends TLS).',
  },
  GW_ERR_API_BAD_KEY: {
    status: 400,
    summary: 'A login or join request carries a public key the gateway cannot use (public_key is not a PEM public key, ssh_public_key not an OpenSSH public key line of a supported type); nothing was consumed.',
    hint: 'Send the keys the gateway generated (gwsh and gateway start do); a join token stays valid after this refusal.',
  },
  GW_ERR_API_TOO_LARGE: {
    status: 413,
    summary: 'An API request body over the 1 MiB limit.',
    hint: 'Split a large manifest into several files.',
  },
  GW_ERR_API_NOT_FOUND: {
    status: 404,
    summary: 'An API path the server does not have.',
    hint: 'Check that the client and the server run the same version.',
  },
  GW_ERR_API_BAD_RESPONSE: {
    status: 502,
    summary: 'The server answered with something that is not a gateway API answer.',
    hint: 'Check that the address is the Proxy or the Auth Service of a gateway cluster.',
  },
  GW_ERR_API_TOO_MANY_STREAMS: {
    status: 429,
    summary: "A Proxy opened more event streams to the Auth API than its cap (4 per Proxy); the new one is refused, the open ones go on.",
    hint: 'Check that two Proxy processes do not share one data directory (one host identity); a restarted Proxy gets its stream once the old ones close.',
  },
  GW_ERR_AUTH_UNREACHABLE: {
    status: 503,
    summary: 'A Proxy that runs without the Auth Service in its process cannot reach any Auth API address it was given; new connections that need the Auth Service fail, open ones stay open.',
    hint: 'Check that the Auth Service at gateway.auth_server (or --auth-server) runs and that this machine reaches it on port 3025; the Proxy reconnects by itself.',
  },
  GW_ERR_CLIENT_UNTRUSTED: {
    status: 502,
    summary: "The server's certificate is not signed by a CA this side trusts (no --ca-pin was given and the system does not trust it, or it is another cluster's).",
    hint: "Pass --ca-pin sha256:... ('gwctl status' prints it) so that the cluster CA is trusted after it is checked; the message's hint says what applies to the server dialled.",
  },
  GW_ERR_TLS_NAME_MISMATCH: {
    status: 502,
    summary: 'The server certificate is trusted but does not hold the name or IP address that was dialled; the message lists the DNS and IP names it holds.',
    hint: "Set proxy_service.public_addr (auth_service.public_addr for the Auth Service) to include the address dialled and restart the service, which issues its certificate at start for every public_addr; or dial one of the names the certificate holds.",
  },
  GW_ERR_TLS_CERT_EXPIRED: {
    status: 502,
    summary: 'The server certificate has expired or is not valid yet.',
    hint: 'Check the clocks of both machines (date -u); a Proxy or Auth Service issues a fresh certificate when it restarts, other servers need theirs renewed.',
  },
  GW_ERR_TLS_WRONG_ROLE: {
    status: 502,
    summary: "The server's certificate chains to the cluster's host CA and holds the name dialled, but it is not the certificate of the member expected: a Proxy's must carry the system role proxy, the Auth Service's the role auth, and the release download location is no member at all (another host of the cluster, such as an agent, answered); nothing was sent to it.",
    hint: 'Check where the address resolves and the proxy settings (HTTPS_PROXY) of this machine: something leads it to another host of the cluster. The message names what the certificate is.',
  },
  GW_ERR_TLS_INSPECTED: {
    status: 502,
    summary: "On a dial through a proxy, the server's certificate is not signed by a CA this side trusts but by another CA: a TLS-inspecting proxy (squid ssl_bump, an inspection appliance) answered in the server's place with a certificate of its own; the message names that CA. The certificate is refused; nothing is sent over it.",
    hint: "Give the inspecting proxy's root CA (named in the message) in GATEWAY_PROXY_CA_FILE or NODE_EXTRA_CA_CERTS (an agent: gateway.proxy_ca_file): the cluster's mutual TLS then goes inside a WebSocket upgrade on the Proxy's web address, end to end. Or have the proxy splice (not inspect) TLS to the Proxy's name (squid: ssl_bump splice for an ssl::server_name ACL), or add the name to NO_PROXY where the machine may reach it directly; the message's hint names the host.",
  },
  GW_ERR_TLS_HANDSHAKE_TIMEOUT: {
    status: 504,
    summary: 'A TLS handshake as the client did not complete within its deadline (30 s): the server, or a proxy in the path, took the connection and then stalled.',
    hint: "Check that the address is a TLS server of the cluster and what answers on the way: 'gateway dial-plan --probe HOST:PORT' dials through the same proxy and reports the certificate it sees, if any.",
  },
  GW_ERR_DIAL_UPGRADE_REFUSED: {
    status: 502,
    summary: "The transport through TLS-inspecting proxies was refused: the server at the Proxy's web address did not answer the WebSocket upgrade (GET /webapi/connectionupgrade, subprotocol gateway-alpn) with 101 and that subprotocol. It is not a gateway Proxy, a Proxy older than this transport, or the proxy in the path stripped the upgrade.",
    hint: "Check that the address is the Proxy's web address (gateway dial-plan --probe HOST:PORT shows who answers); a squid in the path forwards WebSocket upgrades only with 'http_upgrade_request_protocols WebSocket allow all'; or have the proxy splice TLS to the Proxy's name.",
  },
  GW_ERR_DIAL_UPGRADE_TIMEOUT: {
    status: 504,
    summary: "The transport through TLS-inspecting proxies did not come up within its deadline (30 s for the dial, the outer TLS and the upgrade's answer together).",
    hint: "Check the proxy's log for the CONNECT to the Proxy's web address and the GET /webapi/connectionupgrade inside it; 'gateway dial-plan --probe HOST:PORT' dials the same path.",
  },
  GW_ERR_DIAL_UPGRADE_ROOTS: {
    status: 500,
    summary: 'A CA file named for TLS-inspecting proxies (GATEWAY_PROXY_CA_FILE, NODE_EXTRA_CA_CERTS, gateway.proxy_ca_file) cannot be read or holds no PEM certificate, or none was given when the upgrade transport needed one.',
    hint: "Point the setting at a readable PEM file with the root CA your organisation's inspecting proxy signs with (ask its administrators, or export it from a browser on a managed machine).",
  },
  GW_ERR_DIAL_PROBE_FAILED: {
    status: 502,
    summary: "'gateway dial-plan --probe' reached the target (directly or through the proxy) but the TLS handshake failed: the peer is not a TLS server, or it or a proxy in the path broke the connection.",
    hint: 'Check that the target is the TLS address of the Proxy (its web or TLS routing port), and the proxy log for what happened to the CONNECT.',
  },
  GW_ERR_CLIENT_NOT_LOGGED_IN: {
    status: 401,
    summary: 'gwsh has no profile: nobody is signed in.',
    hint: "Run 'gwsh login --proxy=HOST:PORT --user=USER'.",
  },
  GW_ERR_CLIENT_CERT_EXPIRED: {
    status: 401,
    summary: "The user certificate of the gwsh profile has expired (gwsh sees it before connecting; the Proxy and the Auth API refuse an expired user certificate with this code too).",
    hint: "Run 'gwsh login' again for a fresh certificate ('gwsh status' shows until when it is valid).",
  },
  GW_ERR_CLIENT_PASSWORD_MISMATCH: {
    status: 400,
    summary: 'A new password and its confirmation, typed on the terminal, differed at each of the 3 tries; nothing was changed.',
    hint: 'Run the command again and type the same password twice (or pipe it as the first line of standard input).',
  },
  GW_ERR_CLIENT_KUBECONFIG: {
    status: 400,
    summary: "The kubeconfig gwsh kube login (or gwsh proxy kube --kubeconfig) would merge into is not one: not YAML, not a mapping, its clusters, users or contexts not lists, or larger than 4 MiB; it was left as it was.",
    hint: 'Fix the file (kubectl config view shows what kubectl reads of it), or write to another one with --kubeconfig FILE (or KUBECONFIG=FILE).',
  },
  GW_ERR_CLIENT_KUBECONFIG_WRITE: {
    status: 500,
    summary: 'gwsh kube login (or gwsh proxy kube --kubeconfig) cannot write the kubeconfig (its directory or the file is not writable, or the disk is full); the file was left as it was.',
    hint: 'Check the permissions of the file and of its directory, or write to another one with --kubeconfig FILE (or KUBECONFIG=FILE).',
  },
  GW_ERR_CLIENT_PROFILE: {
    status: 500,
    summary: 'The gwsh profile in ~/.gwsh (or $GWSH_HOME) cannot be read or is damaged.',
    hint: "Run 'gwsh logout' and 'gwsh login' again.",
  },
  GW_ERR_CLIENT_NO_CREDENTIALS: {
    status: 401,
    summary: 'gwctl found neither a gwsh profile nor a readable local admin identity.',
    hint: "Sign in with 'gwsh login', or run gwctl on the Auth Service's machine (--data-dir if not /var/lib/gateway).",
  },
  GW_ERR_E2E_UNAVAILABLE: {
    status: 503,
    summary: "gwsh was asked for end-to-end streams only (--e2e require, GWSH_E2E=require) and this connection could not have one: the Proxy answered that the resource's agent takes none (an earlier version, a v1 tunnel, its tunnel on another Proxy), the Proxy does not take grant requests (an earlier version), or the end-to-end connection failed before the agent's certificate was checked; the message names which. Nothing went the classic way.",
    hint: "Upgrade the Proxy and the agent to a version with end-to-end streams and let the agent's tunnel reach this Proxy, or run with --e2e auto to use the classic route (the Proxy then sees the stream) when no end-to-end stream can be had.",
  },
  GW_ERR_E2E_AGENT: {
    status: 502,
    summary: "The server at the other end of an end-to-end stream is not the agent the grant names: its certificate is not signed by the cluster's host CA or not valid now, is not a host certificate of this cluster, names another host ID, or lacks the service's system role (node, db, app). Nothing was sent to it, and gwsh did not fall back to the classic route.",
    hint: "Something on the path (the Proxy itself, or what is between it and the agent) routed the stream to another host: report it to the cluster's administrators with the host ID in the message; 'gwctl get nodes' lists the agents' host IDs.",
  },
  GW_ERR_AGENT_IDENTITY: {
    status: 500,
    summary: "An agent has no usable host identity: it never joined, its stored identity is damaged, or it now runs services it did not join for.",
    hint: "Join with --token, --ca-pin and --proxy as printed by 'gwctl tokens add'.",
  },
  GW_ERR_LISTEN: {
    status: 500,
    summary: 'A listener cannot bind its address (in use, permission for ports below 1024, address not on this machine).',
    hint: 'The message names the configuration key; change the address or stop the other process.',
  },
  GW_ERR_DIAG_ADDR_PUBLIC: {
    status: 500,
    summary: 'The diagnostics listener (--diag-addr, gateway.diag_addr) is set to the address of a public listener: its plain-HTTP health answers would be served where clients and agents connect.',
    hint: 'Never on the public port: give --diag-addr an address only the supervisor reaches, e.g. 127.0.0.1:3000 (or the pod IP for Kubernetes probes).',
  },
  GW_ERR_PROBE_FAILED: {
    status: 502,
    summary: "A probe (gwctl probe) did not get through: the hop it names (find, peer, tunnel, resource) failed or passed its deadline.",
    hint: "The answer names the hop: 'find' means no live agent serves it, 'tunnel' an agent that does not answer, 'resource' the resource behind the agent; see docs/operations.md, Probing the path.",
  },

  // --- single sign-on: OIDC, SAML and the code-hosting OAuth connector (src/auth/sso) -------------------------------
  GW_ERR_SSO_CONNECTOR_UNKNOWN: {
    status: 404,
    summary: 'No connector of that kind and name exists (or sign-in through it is not possible), so there is nothing to sign in with.',
    hint: "List the connectors with 'gwctl get oidc', 'gwctl get saml' or 'gwctl get github', and use one of their names.",
  },
  GW_ERR_SSO_STATE_INVALID: {
    status: 400,
    summary: 'The single sign-on callback names a sign-in request that does not exist: unknown, already used (a replayed callback), expired (10 minutes), or of another connector.',
    hint: 'Start the sign-in again from the login page (or gwsh login --auth=NAME) and finish it within 10 minutes, in the same browser.',
  },
  GW_ERR_SSO_TOKEN_INVALID: {
    status: 401,
    summary: "The identity provider's answer failed a check; the message names it: signature, audience, issuer, nonce, expired, in_response_to, ...",
    hint: "Check the connector's issuer_url / metadata, client_id and entity IDs against the identity provider, and the clocks of both machines; a forged answer is refused on purpose.",
  },
  GW_ERR_SSO_IDP_ERROR: {
    status: 502,
    summary: 'The identity provider answered with an error, or could not be reached (through HTTPS_PROXY if set).',
    hint: "Check that the identity provider is up and reachable from the Auth Service (and its proxy settings), and the connector's client ID and secret.",
  },
  GW_ERR_SSO_NO_ROLES: {
    status: 403,
    summary: "The connector's mapping gives the user no role, so the sign-in is refused.",
    hint: "Add the user to a group, team or attribute value that the connector's claims_to_roles / attributes_to_roles / teams_to_roles maps to a role.",
  },
  GW_ERR_SSO_USERNAME_REFUSED: {
    status: 403,
    summary: "The identity provider's answer has no claim that may name the user: by default a verified e-mail address (email with email_verified true); the message names the claim that is missing or not verified.",
    hint: "Verify the address at the identity provider, or set the OIDC connector's username_claim (e.g. preferred_username) or allow_unverified_email: true if the provider never sends email_verified.",
  },

  // --- the web: sessions of the browser (src/auth/websessions.ts) -------------------------------------------------
  GW_ERR_WEB_SESSION_MISSING: {
    status: 401,
    summary: 'A request from the browser carries no web session cookie (not signed in, or the browser dropped the expired cookie).',
    hint: 'Sign in on the web page; the cookie is sent only over HTTPS to the very host that set it.',
  },
  GW_ERR_WEB_SESSION_EXPIRED: {
    status: 401,
    summary: 'The web session has expired (it lasts as long as a user certificate would).',
    hint: 'Sign in again on the web page.',
  },
  GW_ERR_WEB_SESSION_INVALID: {
    status: 401,
    summary: 'The web session is unknown (signed out, tampered cookie), or the request lacks the bearer token of that very session, or a one-time token (bearer handout, app launch) was used already, expired or is for another app.',
    hint: 'Sign in again on the web page; an app is opened again from the resources page.',
  },
  GW_ERR_WEB_CSRF: {
    status: 403,
    summary: "A state-changing request came from another site: its Origin header is not the page's own origin.",
    hint: 'Use the web UI from its own address; requests from other sites are refused.',
  },
  GW_ERR_WEB_APP_LAUNCH_UNBOUND: {
    status: 403,
    summary: "An app launch came to the app's host without the launch nonce it was bound to: no state, a state that is not this browser's nonce cookie, or a token bound to another nonce (a launch link made in another browser, e.g. someone else's).",
    hint: "Open the app from the Web UI's resources page in this browser; a launch link someone else gave you is refused on purpose.",
  },
  GW_ERR_APP_UPGRADE_TIMEOUT: {
    status: 504,
    summary: "An HTTP app did not answer a connection upgrade (WebSocket or another Upgrade) within the web port's header_timeout; nothing was upgraded.",
    hint: "Check that the app serves upgrades on that path (its own logs), or raise gateway.limits.header_timeout on the Proxy if it is only slow to answer.",
  },
  GW_ERR_APP_UPGRADE_UNASKED: {
    status: 502,
    summary: 'An HTTP app switched protocols (101) to something the client did not ask for: on a request without Upgrade, or to another protocol than the one the request named, or to none (a 101 without an Upgrade header); nothing was upgraded.',
    hint: "The app (or something in front of it on the agent's side) answers 101 where it should not: fix its configuration; the Proxy never hands a client a protocol it did not ask for.",
  },
  GW_ERR_WEB_TERMINAL_LIMIT: {
    status: 429,
    summary: 'A web session asked for more terminals at once than the Proxy allows one session (32); the open ones go on.',
    hint: 'Close some terminal tabs of the web page first.',
  },

  // --- identity: certificate authorities, certificates, CA pins (src/auth/pki.ts) -----------------------------
  GW_ERR_AUTH_BAD_PIN: {
    status: 500,
    summary: 'A CA pin is not of the form sha256:<64 hexadecimal digits> (the prefix may be left out, but not given twice).',
    hint: "Copy the pin exactly as 'gwctl status' prints it (sha256: followed by 64 hex digits).",
  },
  GW_ERR_AUTH_BAD_CERT: {
    status: 500,
    summary: 'A certificate is missing, cannot be parsed, or carries no valid gateway identity.',
    hint: 'Sign in again (gwsh login) or re-join the agent to get a fresh certificate from this cluster.',
  },
  GW_ERR_PKI_BAD_KEY: {
    status: 500,
    summary: 'A key is not in a form the gateway accepts, or a CA private key does not match its certificate.',
    hint: 'Use PEM keys (PKCS#8 private, SPKI public) or OpenSSH public key lines; ECDSA P-256 keys work everywhere.',
  },
  GW_ERR_PKI_BAD_REQUEST: {
    status: 500,
    summary: 'A certificate request is invalid (empty name or principals, control characters, bad DNS name or IP, non-positive TTL).',
    hint: 'The message names the field to correct.',
  },
  GW_ERR_PKI_CA_EXPIRED: {
    status: 500,
    summary: 'A certificate authority is outside its validity period and cannot issue certificates.',
    hint: "Rotate the cluster's certificate authorities, or check this machine's clock.",
  },

  // --- version server for automatic agent upgrades (src/proxy/versions.ts) ------------------------------------
  GW_ERR_VERSION_BAD_PATH: {
    status: 400,
    summary: 'A version-server request path is not .../channel/<channel>/version or .../critical (empty, "." or ".." segment, bad percent-encoding, no channel, other suffix).',
    hint: 'Ask /v1/webapi/automaticupgrades/channel/<channel>/version (or /critical), e.g. .../channel/default/version.',
  },
  GW_ERR_VERSION_UNKNOWN_CHANNEL: {
    status: 404,
    summary: 'The version server has no channel by that name (only default and the channels in automatic_upgrades_channels exist).',
    hint: 'Check the channel name in the agent\'s upgrader settings, or add the channel to proxy_service.automatic_upgrades_channels on every Proxy.',
  },
  GW_ERR_VERSION_UPSTREAM: {
    status: 502,
    summary: "A forward_url channel's upstream version server failed (unreachable, error status, or an answer that is not a version / yes / no); no cached value is served instead.",
    hint: 'Check the forward_url and that the upstream answers <forward_url>/version through HTTPS_PROXY / NO_PROXY as this Proxy sees them.',
  },
  GW_ERR_VERSION_UPSTREAM_TIMEOUT: {
    status: 504,
    summary: "A forward_url channel's upstream version server did not answer within the deadline (5 s by default).",
    hint: 'Check that the upstream is up and reachable from the Proxy (through the proxy in HTTPS_PROXY, if set); agents retry later.',
  },

  // --- release artifacts through the Proxy (src/proxy/artifacts.ts) ---------------------------------------------
  GW_ERR_ARTIFACT_DISABLED: {
    status: 404,
    summary: 'This Proxy relays no release artifacts: proxy_service.autoupdate_artifacts names no download_url (tarballs) or repo_url (package repository).',
    hint: 'Set proxy_service.autoupdate_artifacts.download_url and/or repo_url on every Proxy (docs/upgrades.md, "Artifacts through the Proxy"), or point the agent at the download site directly.',
  },
  GW_ERR_ARTIFACT_BAD_PATH: {
    status: 400,
    summary: 'An artifact or repository path the relay does not take: not a release tarball name (or its .sha256), a "..", "." or empty segment (also percent-encoded), characters file names of a repository do not use, a query, or too long.',
    hint: 'Ask /v1/webapi/autoupdate/artifacts/gateway-ent-v<version>-linux-<arch>-bin.tar.gz (or .sha256), or /v1/webapi/autoupdate/repo/<path in the repository> without a query.',
  },
  GW_ERR_ARTIFACT_NOT_FOUND: {
    status: 404,
    summary: 'The upstream download site or repository has no such file (it answered 404 or 410).',
    hint: "Check the version and architecture the agent asks for, and that the upstream (download_url / repo_url) has it; an index that is not there is normal for some package managers.",
  },
  GW_ERR_ARTIFACT_UPSTREAM: {
    status: 502,
    summary: 'Fetching an artifact from the upstream failed: unreachable, an error status, a redirect it may not follow, more bytes than allowed, or cut before the end; nothing partial is cached.',
    hint: "Check download_url / repo_url and that the Proxy reaches them through its HTTPS_PROXY / NO_PROXY (gateway dial-plan <url> on the Proxy's host); the agent retries on its next run.",
  },
  GW_ERR_ARTIFACT_UPSTREAM_TIMEOUT: {
    status: 504,
    summary: 'The upstream did not answer, or stopped sending, within proxy_service.autoupdate_artifacts.fetch_timeout, or a whole fetch took longer than fetch_deadline.',
    hint: 'Check that the upstream and the corporate proxy on the way are up; raise fetch_timeout (or fetch_deadline) for a slow link.',
  },
  GW_ERR_ARTIFACT_BUSY: {
    status: 503,
    summary: 'The Proxy is already fetching as many different artifacts as it allows at once; this one was not started.',
    hint: 'Retry in a moment (the upgrader runs again on its timer); requests for a file already being fetched always share that fetch.',
  },
  GW_ERR_ARTIFACT_CACHE: {
    status: 500,
    summary: "The artifact cache directory cannot be created, read or written (proxy_service.autoupdate_artifacts.cache_dir).",
    hint: 'Check that cache_dir exists or can be created, belongs to the user the Proxy runs as, and has free space.',
  },

  // --- automatic agent upgrades: windows, schedule export, gateway-upgrade (src/upgrade) --------------------------
  GW_ERR_UPGRADE_ENDPOINT: {
    status: 500,
    summary: 'The upgrader endpoint file (/etc/gateway-upgrade.d/endpoint) is missing or its value is not <host>:<port>/v1/webapi/automaticupgrades/channel/<channel> (an https:// prefix, a /version suffix, no channel, several values).',
    hint: 'Write one line such as proxy.example.com:443/v1/webapi/automaticupgrades/channel/default, with no https:// and no /version.',
  },
  GW_ERR_UPGRADE_VERSION_SERVER: {
    status: 502,
    summary: 'The version server (https://<endpoint>/version) could not be asked, or answered something that is not a version.',
    hint: 'Check the endpoint file, that the Proxy is reachable from this host (through HTTPS_PROXY if set; NO_PROXY bypasses it) and that the channel exists.',
  },
  GW_ERR_UPGRADE_INSTRUCTION: {
    status: 502,
    summary: "The managed rollout's instruction for this host (the Proxy's /v1/webapi/autoupdate/agent) could not be read: the Proxy was unreachable, slow, answered an error, or something that is not an instruction. Nothing was installed, and the channel was not used instead.",
    hint: 'Check that the Proxy in the endpoint file is reachable from this host (through HTTPS_PROXY if set) and answers; the next run asks again.',
  },
  GW_ERR_UPGRADE_CLUSTER_TOO_OLD: {
    status: 500,
    summary: 'The cluster (its /webapi/ping server_version) is older than automatic agent upgrades need: v14.3.7 on v14, v15.1.3 on v15 and later; or its version cannot be read.',
    hint: 'Upgrade the Auth and Proxy Services first (at least v14.3.7, or v15.1.3 on v15), then the agents enroll by themselves.',
  },
  GW_ERR_UPGRADE_INSTALLED_VERSION: {
    status: 500,
    summary: 'The upgrader cannot tell which gateway version is installed (the version command failed or printed no version).',
    hint: 'Check that `gateway --version` works on this host, or set GATEWAY_UPGRADE_VERSION_COMMAND.',
  },
  GW_ERR_UPGRADE_LOCKED: {
    status: 409,
    summary: 'Another gateway-upgrade is running on this host (it holds the lock file); two upgraders never run at once.',
    hint: 'Wait for it to finish; if no gateway-upgrade runs, the lock names a dead process and the next run removes it.',
  },
  GW_ERR_UPGRADE_PACKAGE_MANAGER: {
    status: 500,
    summary: 'No supported way to install the gateway was found (apt, yum, dnf, zypper or a tarball install), or the one configured is unknown.',
    hint: 'Set GATEWAY_UPGRADE_PACKAGE_MANAGER to apt, yum, dnf, zypper or tarball.',
  },
  GW_ERR_UPGRADE_REPO: {
    status: 500,
    summary: 'The package repository entry (/etc/apt/sources.list.d/gateway.list, /etc/yum.repos.d/gateway.repo) is missing, unreadable, or on a channel that cannot hold the target version; or the repository serves metadata the package manager cannot read (nothing was installed).',
    hint: "Register the repository, or move it to the channel named in the message with 'gateway-upgrade repo set-channel <channel>'.",
  },
  GW_ERR_UPGRADE_DOWNLOAD: {
    status: 502,
    summary: 'Downloading the release tarball or its .sha256 file failed.',
    hint: 'Check GATEWAY_UPGRADE_DOWNLOAD_URL and that the address is reachable from this host (through HTTPS_PROXY if set).',
  },
  GW_ERR_UPGRADE_CHECKSUM: {
    status: 502,
    summary: 'The downloaded tarball does not match its .sha256 file, or a package does not match the checksum listed in its repository metadata; nothing was extracted or installed.',
    hint: 'Run the upgrade again; if it keeps failing, the download is being altered on the way (check proxies) or the release is broken.',
  },
  GW_ERR_UPGRADE_TARBALL: {
    status: 502,
    summary: 'The release tarball passed its checksum but is not safe to extract: an entry with an absolute path or "..", a symbolic link pointing outside, a device or unknown entry type, setuid files, too many entries or too many bytes once unpacked, or not a gzip tar at all; nothing was extracted or installed.',
    hint: "A release tarball never holds these: the release the message names, under GATEWAY_UPGRADE_DOWNLOAD_URL, is broken or not genuine. Tell its publisher, do not install it by hand, and run 'gateway-upgrade run' again once it is replaced.",
  },
  GW_ERR_UPGRADE_INSTALL: {
    status: 500,
    summary: 'Installing the target version failed (package manager or tarball install step); the previous version is still installed, or was put back (the message says which).',
    hint: "The message quotes the installer's output; fix that cause (disk space, repository, network) and run 'gateway-upgrade run' again.",
  },
  GW_ERR_UPGRADE_HEALTH: {
    status: 500,
    summary: 'After installing the target version, the new binary failed its self-check (its version command did not run or did not report the target; nothing was restarted) or the service did not come back healthy with it; the upgrader put the previous version back.',
    hint: "Check the service's logs (journalctl -u gateway); the message says whether the rollback succeeded.",
  },
  GW_ERR_UPGRADE_SCHEDULE: {
    status: 500,
    summary: 'The maintenance schedule file cannot be written, or (agent running as a non-root user) does not exist or belongs to another user.',
    hint: 'Create the file and give it to the agent user: sudo install -o <user> -m 0644 /dev/null /etc/gateway-upgrade.d/schedule',
  },

  // --- files (src/fsutil.ts) -------------------------------------------------------------------------------------
  GW_ERR_FS_WRITE: {
    status: 500,
    summary: 'A file the gateway keeps (key, certificate, state) cannot be written.',
    hint: 'Check that the directory named in the message is writable by this user and that the disk is not full.',
  },
  GW_ERR_FS_READ: {
    status: 500,
    summary: 'A file the gateway keeps exists but cannot be read.',
    hint: 'Check the permissions of the file named in the message; keys must be readable by the gateway user.',
  },

  // --- traces: OTLP export (src/trace.ts) ----------------------------------------------------------------------------
  GW_ERR_TRACE_SETTINGS: {
    status: 500,
    summary: 'The tracing settings from the environment cannot be used: OTEL_TRACES_EXPORTER names an exporter other than otlp or none, the OTLP endpoint is not an http(s) URL, OTEL_EXPORTER_OTLP_HEADERS is not key=value pairs, or OTEL_TRACES_SAMPLER_ARG is not a ratio from 0 to 1.',
    hint: 'Fix the variable the message names (docs/operations.md, "Tracing"), or unset it; OTEL_TRACES_EXPORTER=none turns tracing off.',
  },
  GW_ERR_TRACE_EXPORT: {
    status: 502,
    summary: 'The OTLP endpoint did not take the spans sent to it (unreachable, an error status, or no answer within 10 s); spans are dropped until it answers. Logged once, not per span; connections are not affected.',
    hint: 'Check that the collector listens at the URL in the log line (OTLP/HTTP, JSON, usually port 4318 and path /v1/traces) and that gateway.tracing.headers carries the key it wants.',
  },

  // --- multiplexer: sniffing, ClientHello, PROXY protocol (src/mux) -----------------------------------------------
  GW_ERR_MUX_BAD_HELLO: {
    status: 400,
    summary: 'A connection on the TLS port sent a TLS ClientHello that is malformed (bad record, length past the end, bad server name or ALPN list); the message gives the reason.',
    hint: 'The client is not speaking TLS correctly, or something between it and the Proxy alters the stream; check for a middlebox or a port scanner.',
  },
  GW_ERR_MUX_HELLO_TOO_LARGE: {
    status: 400,
    summary: 'A TLS ClientHello is larger than the multiplexer accepts (16 KiB plus record headers by default).',
    hint: 'Real clients send far smaller hellos; if a legitimate client does, check for an unusual number of extensions or a huge server name.',
  },
  GW_ERR_MUX_BAD_PROXY_HEADER: {
    status: 400,
    summary: 'A PROXY protocol header (v1 text or v2 binary) from a load balancer is malformed, too long, or announces something the gateway refuses (UDP).',
    hint: "Check the load balancer's PROXY protocol settings (version, TCP only) and that only it can reach this port.",
  },
  GW_ERR_MUX_PROXY_HEADER_UNTRUSTED: {
    status: 403,
    summary: 'A PROXY protocol header arrived from a source that proxy_service.proxy_protocol_trusted_sources does not list; the connection was closed before anything else was read (the address the header named is not used anywhere).',
    hint: 'If the source is your load balancer, add its address or network to proxy_service.proxy_protocol_trusted_sources; otherwise a client that reaches the Proxy directly is trying to pick the address it is counted under.',
  },

  // --- reverse tunnels and routing to resources -------------------------------------------------------------------
  GW_ERR_TUNNEL_PROTOCOL: {
    status: 502,
    summary: 'A peer broke the reverse-tunnel protocol (a header line that is not JSON, too long, or missing; a v2 frame that is malformed, over its cap or beyond the granted window).',
    hint: 'Agents and Proxies of different versions negotiate the tunnel protocol (ALPN), so a break is a bug or something rewriting the bytes in between (a TLS-inspecting proxy): check the log of the other end, and that nothing on the path terminates TLS.',
  },
  GW_ERR_TUNNEL_TIMEOUT: {
    status: 504,
    summary: 'A tunnel peer did not answer in time (hello, dial answer, route header).',
    hint: 'The agent or the resource behind it may be overloaded or unreachable; check its logs.',
  },
  GW_ERR_TUNNEL_NOT_FOUND: {
    status: 404,
    summary: 'No connected agent serves the resource asked for (database, app, desktop, cluster or node).',
    hint: "List what is reachable with 'gwsh ls' (servers), 'gwsh db ls' or 'gwsh apps ls'; the agent may be offline.",
  },
  GW_ERR_TUNNEL_DIAL_FAILED: {
    status: 502,
    summary: 'The agent could not connect to the resource behind it; the message names the resource, the agent and why.',
    hint: "Check that the resource runs and that the address in the agent's configuration is right.",
  },
  GW_ERR_E2E_GRANT: {
    status: 403,
    summary: "An end-to-end stream's grant was refused by the Proxy: its line (GWE2E1) carries no grant, or a grant that is forged, expired or routed by this Proxy already, or whose issuer certificate is not a live Proxy's of this cluster.",
    hint: "Grants are single-use and live 30 s: let gwsh ask for a new one (run the command again). A client that reuses a grant or sends a line of its own is not gwsh; otherwise the Proxy that signed it may have left the cluster since ('gwctl get proxies'), or the clocks of the Proxies disagree by more than the grant's life.",
  },
  GW_ERR_E2E_DATA: {
    status: 400,
    summary: "An agent's data connection for end-to-end streams was refused by the Proxy: its preamble is malformed, over its cap or late, names no tunnel of this Proxy, carries a wrong MAC or a number used before, or it sent bytes while idle, or the tunnel already has twice its pool idle here. The agent is answered GWDATA1 no <reason> and retries after its backoff.",
    hint: "An agent dials its data connections after its v2 tunnels are welcomed, with one proof per tunnel it holds through that address: check that the agent is of this version, that it holds a tunnel to this Proxy through the same address (behind a load balancer: agent_mesh, and the balancer in front of every Proxy), and that nothing between it and the Proxy (a TLS-inspecting proxy) rewrites the connections; the agent reconnects its tunnels on its own.",
  },
  GW_ERR_KUBE_CREDENTIALS: {
    status: 502,
    summary: "The Kubernetes Service could not read its credential for the API server: the service-account token or CA (credentials: in_cluster) or the kubeconfig's context, user, token or certificate (credentials: kubeconfig) is missing, empty, oversized or malformed; the message names the file.",
    hint: "In a pod, check that the service account's token is mounted (automountServiceAccountToken not false) at service_account_dir; outside one, check that kubeconfig and kubeconfig_context name a context whose user has a token or client certificate ('kubectl config view --minify --raw' shows it).",
  },
  GW_ERR_KUBE_AUTH_UNSUPPORTED: {
    status: 502,
    summary: "The kubeconfig's user authenticates in a way the Kubernetes Service does not run: an exec plugin, an auth-provider, a username and password, or insecure-skip-tls-verify.",
    hint: "Give the agent a context whose user has a token (token or tokenFile) or a client certificate (client-certificate and client-key), and a CA (certificate-authority); for a cloud cluster, create a service account with a long-lived token for the agent.",
  },
  GW_ERR_KUBE_NO_IMPERSONATION: {
    status: 403,
    summary: "The user's roles allow the Kubernetes cluster but name no Kubernetes user or group to act as (kubernetes_users and kubernetes_groups are empty), or the user asked (kubectl --as / --as-group) for one the roles do not allow; nothing was sent to the API server.",
    hint: "Ask an administrator to add kubernetes_groups (such as system:masters or a group bound by a RoleBinding) or kubernetes_users to a role of yours under allow, then sign in again; with several kubernetes_users allowed, pick one with kubectl --as.",
  },
  GW_ERR_KUBE_UPGRADE_TIMEOUT: {
    status: 504,
    summary: "The Kubernetes API server (or the agent in front of it) did not answer a connection upgrade (kubectl exec, attach or port-forward: WebSocket or SPDY/3.1) within header_timeout; nothing was upgraded.",
    hint: "Check the API server and the kube agent's logs (the agent's connection to the API server, its credential); raise gateway.limits.header_timeout on the Proxy if the API server is only slow to answer.",
  },
  GW_ERR_KUBE_UPGRADE_UNASKED: {
    status: 502,
    summary: 'The Kubernetes API server switched protocols (101) to something kubectl did not ask for (another protocol, or none named); nothing was upgraded.',
    hint: "Something between the agent and the API server answers 101 where it should not (a proxy in front of the API server?): check the agent's api_server address.",
  },
  GW_ERR_KUBE_CLUSTER_NOT_FOUND: {
    status: 404,
    summary: 'No Kubernetes cluster of that name is reachable with your roles: no connected agent serves it, or your roles do not allow it.',
    hint: "Run 'gwsh kube ls' for the clusters you may reach, and give one of those names.",
  },
  GW_ERR_DB_USER_DENIED: {
    status: 403,
    summary: "The agent refused a database connection: the database user the client asked for in the protocol's startup is not among the db_users the user's roles allow (or a role denies it).",
    hint: "Connect as a database user your roles allow ('gwsh status' names your roles), or ask for a role whose db_users include it (templates such as {{internal.db_users}} read your traits), then sign in again.",
  },
  GW_ERR_DB_NAME_DENIED: {
    status: 403,
    summary: "The agent refused a database connection: the database name the client asked for is not among the db_names the user's roles allow (or a role denies it).",
    hint: "Connect to a database your roles allow, or ask for a role whose db_names include it, then sign in again.",
  },
  GW_ERR_DB_PROTOCOL: {
    status: 400,
    summary: "The agent could not read the database client's startup (malformed, oversized, truncated, TLS asked of the database itself, or not in time), so it could not check the database user and name and closed the connection.",
    hint: "Use the database's own client through 'gwsh proxy db' without TLS to the database (sslmode=disable or prefer for psql, no --ssl for mysql, no --tls or compressors for mongosh): the tunnel already encrypts the way to the agent.",
  },
  GW_ERR_TUNNEL_AUTH: {
    status: 502,
    summary: 'The Proxy refused an agent (unknown host, wrong key, certificate from another cluster), or the agent refused the Proxy.',
    hint: 'Join the agent again with a new token if its host identity was removed or belongs to another cluster.',
  },
  GW_ERR_E2E_REFUSED: {
    status: 403,
    summary: "The agent refused an end-to-end stream: the grant (its signature by the tunnel's Proxy, this agent, the resource, single use, expiry), the user certificate (this cluster's user CA, the grant's user, key and roles) or a lock the Proxy told it of did not pass; the message says which check.",
    hint: "Connect again (a grant is single-use and lives 30 s); if it is refused again, run 'gwsh login' for a fresh certificate (its key and roles must be the ones the Proxy authorized), check the locks (gwctl get locks) and that the Proxy and the agent agree on the time.",
  },
  GW_ERR_TUNNEL_DOWN: {
    status: 502,
    summary: 'The reverse tunnel to the Proxy is not connected (the agent is reconnecting).',
    hint: 'The agent retries by itself; check the network path and HTTPS_PROXY if it does not come back.',
  },
  GW_ERR_TUNNEL_RUNG: {
    status: 502,
    summary: "A rung of the agent's transport ladder does not work from here: the web address answered TLS but did not accept the reverse-tunnel ALPN (something in the path ends TLS itself, such as an L7 load balancer), or a probe of a better rung did not bring a tunnel up in time; the agent uses the next rung.",
    hint: "Nothing to do while the agent holds a tunnel on another rung (the log line 'transport ladder' says which and why); to use the best rung, let the web address pass TLS through untouched (an L4 load balancer, or TLS passthrough) to the Proxy.",
  },
  GW_ERR_PEER_UNREACHABLE: {
    status: 502,
    summary: "Proxy peering: this Proxy cannot reach the Proxy that holds the agent's tunnel (TCP, TLS or the peering session failed, or it refused this Proxy).",
    hint: "Check that the other Proxy's peering address ('gwctl get proxies'; proxy_service.peer_public_addr) is reachable from this one on peer_listen_addr (3021), and NO_PROXY if HTTPS_PROXY is set.",
  },
  GW_ERR_PEER_PROTOCOL: {
    status: 400,
    summary: 'A Proxy broke the peering protocol (a stream without a target host or dial request, a header over the cap, or no answer in time).',
    hint: 'Check that both Proxies run the same version.',
  },

  // --- direct-join agents: the Proxy dials the agent's own listeners (src/proxy/direct.ts, src/agent/direct.ts) ----
  GW_ERR_DIRECT_NO_LISTENER: {
    status: 502,
    summary: 'The agent joined the Auth Service directly but advertises no listener for the service asked for (only SSH, Kubernetes and Windows Desktop Services have one).',
    hint: 'Check that the service is enabled on the agent and that its listen_addr (ssh_service, kube_service or windows_desktop_service) is reachable from the Proxy; databases and apps need an agent that joined through a Proxy.',
  },
  GW_ERR_DIRECT_UNREACHABLE: {
    status: 502,
    summary: "The Proxy could not connect to a direct-join agent's listener in time; the message names the agent and the address.",
    hint: "Check that the agent runs, that the Proxy can reach the address it advertises (its listen_addr, or the service's public_addr), and the firewall in between.",
  },
  GW_ERR_DIRECT_AUTH: {
    status: 502,
    summary: "Mutual TLS between the Proxy and a direct-join agent failed: the agent's certificate is not the host certificate of the agent expected, or the agent refused the caller (only Proxies of the cluster are accepted).",
    hint: 'Check that both belong to the same cluster; an agent whose host identity was removed must join again with a new token.',
  },

  GW_ERR_DIRECT_ADDR_REFUSED: {
    status: 403,
    summary: "The Auth Service refused a listener address in a direct-join agent's presence: its host is neither a wildcard, the address the heartbeat came from, nor one of the agent's public addresses from its join, or it is a loopback, link-local, unspecified or multicast address (the Proxy would dial it).",
    hint: "Set the service's listen_addr to a wildcard (0.0.0.0:port) or to the address the agent reaches the Auth Service from, or its public_addr to one given at join (--public-addr); a Proxy never dials loopback or link-local addresses.",
  },
  GW_ERR_DIRECT_FORWARDED: {
    status: 403,
    summary: "An agent's own Auth API call (/v1/agent/*) came through a Proxy's web port; the Auth Service takes these only on its own listener, from the agent's socket.",
    hint: 'Point the agent at the Auth Service itself (--auth-server host:3025); an agent that joined through a Proxy uses its reverse tunnel and writes no presence itself.',
  },
  GW_ERR_DIRECT_CLOCK: {
    status: 400,
    summary: "A direct-join agent's presence has a connected_at more than a minute in the future, or more than a minute before the agent joined.",
    hint: "Check the agent's clock (NTP): it must agree with the Auth Service's within a minute.",
  },

  // --- cluster members acting for themselves only (src/auth/memberchecks.ts, src/auth/audit.ts) ----------------
  GW_ERR_MEMBER_PRESENCE_REFUSED: {
    status: 403,
    summary: "The Auth Service refused a presence record a Proxy wrote: the host ID is not a host ID, no agent joined under it (or it joined as a Proxy only), it is locked, or the record's times cannot be the tunnel's.",
    hint: "A Proxy writes presence only for the agents whose tunnels it holds, under the host ID each tunnel authenticated; check that the agent is still a member ('gwctl get nodes') and not locked ('gwctl get locks'), and the Proxy's clock.",
  },
  GW_ERR_MEMBER_EVENT_REFUSED: {
    status: 403,
    summary: "The Auth Service refused an audit event a cluster member reported: its kind is not one that member may report (agents and Proxies report the sessions they carry, never logins or administration), or a Proxy reported for an agent whose tunnel it does not hold.",
    hint: "Nothing to change on an honest member: it reports only its own sessions. A refusal names the kind and the reporter; a member that sends others' events is misbehaving and may be locked (gwctl lock --node HOST_ID).",
  },

  // --- SSH Service: the built-in sftp-server (src/agent/sftp) ---------------------------------------------------------
  GW_ERR_SFTP_PROTOCOL: {
    status: 400,
    summary: 'The built-in sftp-server stopped: its client sent bytes that are not SFTP (a packet it cannot parse, or longer than 256 KiB), or its input or output failed.',
    hint: 'Use an SFTP client (sftp, scp); `gateway sftp-server` is run by the SSH Service, not by hand.',
  },
  GW_ERR_SFTP_UNAVAILABLE: {
    status: 500,
    summary: "The built-in sftp-server cannot run: the installed ssh2 no longer has the SFTP server class it runs (src/internals.ts), so the gateway's files do not match its package.json.",
    hint: "Reinstall the gateway (its package pins ssh2), or set ssh_service.sftp_server to the system's sftp-server (e.g. /usr/lib/openssh/sftp-server).",
  },

  // --- daemon under systemd: pid file, `gateway install systemd` (src/reload.ts, src/upgrade/systemd.ts) -------
  GW_ERR_AGENT_DRAINING: {
    status: 503,
    summary: 'The agent is stopping or handing over to its successor: it finishes the sessions in flight and takes no new one.',
    hint: 'Connect again: the successor (or the replacement pod) takes new sessions once its tunnel is up; if none comes, start the agent again (systemctl start gateway).',
  },
  GW_ERR_DRAIN_LIMIT: {
    status: 503,
    summary: 'A session outlived gateway.drain_limit in an agent that was handing over or stopping, and was closed.',
    hint: "Reconnect: the new process serves it. Raise gateway.drain_limit (and the unit's TimeoutStopSec / the pod's terminationGracePeriodSeconds with it) if sessions must outlive restarts longer.",
  },
  GW_ERR_HANDOVER_BUSY: {
    status: 409,
    summary: 'A hand-over (SIGUSR2) was asked for while one is already in progress, or while the process drains; it is not started twice.',
    hint: 'Wait for the first to finish (the log says when the successor is ready); one successor at a time.',
  },
  GW_ERR_HANDOVER_FAILED: {
    status: 502,
    summary: 'The successor of a hand-over did not become ready (it exited, or its tunnels were not welcomed before the deadline); the old process keeps serving.',
    hint: "Read the successor's error in the log (the same journal): fix it (configuration, binary, identity) and hand over again; the upgrader rolls back by itself.",
  },
  GW_ERR_PID_FILE_BUSY: {
    status: 409,
    summary: 'The pid file given with --pid-file belongs to a gateway that is still running; a second one does not start.',
    hint: 'Stop the running gateway first (systemctl stop gateway, or kill the pid named in the message), or give this one another --pid-file.',
  },
  GW_ERR_DATA_DIR_IN_USE: {
    status: 409,
    summary: 'Another running gateway uses this data directory; two daemons never share one (their keys, backend and identity would mix).',
    hint: 'Give this gateway a data directory of its own: gateway.data_dir in its configuration or --data-dir (an agent on the Proxy\'s machine, e.g. /var/lib/gateway-agent).',
  },
  GW_ERR_PID_FILE_WRITE: {
    status: 500,
    summary: 'The pid file given with --pid-file (or its directory) cannot be written.',
    hint: 'Run as a user that can write there (/run needs root), or choose another --pid-file.',
  },
  GW_ERR_INSTALL_EXISTS: {
    status: 409,
    summary: '`gateway install systemd --output` would replace unit files that already exist; nothing was written.',
    hint: 'Add --force to replace them, or choose another --output.',
  },

  // --- managed rollouts (src/auth/rollout, autoupdate_config / autoupdate_version) ------------------------------
  GW_ERR_AUTOUPDATE_SCHEDULE: {
    status: 400,
    summary: 'An autoupdate_config field is not allowed: a group name, a duplicate group, more than 16 groups, a start hour, a canary count, a duration, or a catch_all naming no group; nothing was stored.',
    hint: 'Fix the field named in the problem; docs/upgrades.md ("Managed rollouts") lists every field and its bounds.',
  },
  GW_ERR_AUTOUPDATE_TIME_ZONE: {
    status: 400,
    summary: "A group's time_zone is not an IANA time zone name this Node.js knows; nothing was stored.",
    hint: 'Write a name of the IANA database such as Europe/Paris, America/New_York or UTC (not an abbreviation such as CET or PST).',
  },
  GW_ERR_AUTOUPDATE_VERSION: {
    status: 400,
    summary: 'An autoupdate_version version is not a semantic version (x.y.z, an optional leading v); nothing was stored.',
    hint: 'Write start_version and target_version as released versions such as 17.0.2.',
  },
  GW_ERR_AUTOUPDATE_MAJOR: {
    status: 400,
    summary: "A rollout target whose major version is above the control plane's (the Auth Service's), or more than one major above start_version: agents never run it; nothing was stored.",
    hint: 'Upgrade the Auth Service and the Proxies first, then roll agents out one major version at a time.',
  },
  GW_ERR_AUTOUPDATE_READ_ONLY: {
    status: 405,
    summary: 'autoupdate_agent_rollout is what the Auth Service computed: it cannot be created, applied or removed.',
    hint: "Change autoupdate_config or autoupdate_version instead, or steer the rollout with 'gwctl autoupdate start|suspend|resume|mark-done|rollback'.",
  },
  GW_ERR_AUTOUPDATE_NOT_CONFIGURED: {
    status: 404,
    summary: 'A rollout command with no rollout to act on: no autoupdate_version sets a target.',
    hint: "Create an autoupdate_version with start_version and target_version ('gwctl create -f'), then steer it.",
  },
  GW_ERR_AUTOUPDATE_GROUP: {
    status: 404,
    summary: 'A rollout command named a group that autoupdate_config does not declare.',
    hint: "List the groups with 'gwctl autoupdate status'.",
  },
  GW_ERR_AUTOUPDATE_CONFLICT: {
    status: 409,
    summary: "The rollout's stored state was changed by another Auth Service between the read and the write, several times over; nothing of this step was written.",
    hint: 'Run the command again: it acts on the state the other Auth Service wrote.',
  },
  GW_ERR_AUTOUPDATE_QUERY: {
    status: 400,
    summary: "An agent's instruction was asked with a bad query: host_id missing or not a host ID, group not [a-z0-9-]{1,32}, or the query too long.",
    hint: 'Ask GET /v1/webapi/autoupdate/agent?host_id=<the host ID in /var/lib/gateway>&group=<group>; gateway-upgrade does.',
  },
  GW_ERR_AUTOUPDATE_UNAVAILABLE: {
    status: 503,
    summary: "The Proxy could not get an agent's instruction from the Auth Service in time; the upgrader keeps the version it runs and asks again.",
    hint: "Check that the Proxy reaches the Auth Service ('gwctl status' on the Proxy's host, its log); nothing needs doing on the agent.",
  },

  // --- Kubernetes updater (src/upgrade/kube) ---------------------------------------------------------------------
  GW_ERR_KUBE_CONFIG: {
    status: 500,
    summary: 'The Kubernetes updater cannot find how to reach the API server (not in a pod, no KUBECONFIG, or an unreadable kubeconfig).',
    hint: 'Run it in the cluster with its service account (the gateway-kube-agent chart does), or set KUBECONFIG / --kubeconfig.',
  },
  GW_ERR_KUBE_API: {
    status: 502,
    summary: 'A Kubernetes API call of the updater failed (refused, forbidden, not found, conflict); the message names the call and the status.',
    hint: 'Check the updater\'s RBAC (get, watch and patch on the agent StatefulSet or Deployment, get on its schedule Secret) and that the names are right.',
  },
  GW_ERR_KUBE_RESOURCE: {
    status: 500,
    summary: 'The agent StatefulSet or Deployment is not what the updater can update (no container of the expected name, or an image without a version tag).',
    hint: 'Point --container at the agent container, whose image must be tagged with its version (e.g. registry/gateway:17.0.1).',
  },
  GW_ERR_AUTOUPDATE_INSTRUCTION: {
    status: 502,
    summary: "The Proxy's rollout instruction (GET /v1/webapi/autoupdate/agent) could not be read: no answer before the deadline, over its size limit, another status than 200 or 404, or a body that is not a valid instruction. The upgrader changes nothing and does not fall back to its channel.",
    hint: 'Check that the Proxy is reachable from the upgrader (through HTTPS_PROXY if set) and runs the same version as the Auth Service; the instruction is asked again at the next run.',
  },
} as const satisfies Record<string, ErrorSpec>;

export type ErrorCode = keyof typeof ERROR_CODES;

/**
 * Whether a code a peer sent (an API answer, a tunnel or peering message) is one this version knows. An own key of
 * ERROR_CODES only: `in` would also take "toString" or "constructor" from the object's prototype.
 */
export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.hasOwn(ERROR_CODES, code);
}

/** The HTTP status an answer carrying this code has (the registry's `status`). */
export function httpStatus(code: ErrorCode): HttpErrorStatus {
  return ERROR_CODES[code].status;
}

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
