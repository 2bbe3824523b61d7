/** Failures as the page shows them: the server's code, message and hint, whatever shape the answer had. */

export interface ApiFailure {
  /** HTTP status; 0 when the Proxy could not be reached at all. */
  status: number;
  /** The server's stable code (GW_ERR_...), or '' when the answer carried none (a load balancer's page). */
  code: string;
  message: string;
  hint: string;
}

export class ApiError extends Error implements ApiFailure {
  readonly status: number;
  readonly code: string;
  readonly hint: string;
  constructor(f: ApiFailure) {
    super(f.message);
    this.name = 'ApiError';
    this.status = f.status;
    this.code = f.code;
    this.hint = f.hint;
  }
}

/** An error body is read up to this many characters; a longer answer is cut. */
const MAX_ERROR_TEXT = 64 * 1024;
/** What is shown of a body that is not one of ours. */
const MAX_SHOWN = 200;

const CODE = /^GW_ERR_[A-Z0-9_]{1,64}$/;

function clip(s: string, max: number): string {
  return s.length > max ? `${s.slice(0, max)}…` : s;
}

/** The failure an HTTP answer carries: {"error":{code,message,hint}} when it is ours, else the status and text. */
export function failureFrom(status: number, statusText: string, body: string): ApiFailure {
  const text = body.slice(0, MAX_ERROR_TEXT);
  try {
    const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown; hint?: unknown } };
    const e = parsed?.error;
    if (e && typeof e === 'object' && typeof e.message === 'string') {
      return {
        status,
        code: typeof e.code === 'string' && CODE.test(e.code) ? e.code : '',
        message: clip(e.message, 2048),
        hint: typeof e.hint === 'string' ? clip(e.hint, 2048) : '',
      };
    }
  } catch {
    // not JSON: a load balancer's or a proxy's own page
  }
  const plain = text.replace(/<[^>]*>/g, ' ').replace(/\s+/g, ' ').trim();
  return {
    status,
    code: '',
    message: `HTTP ${status}${statusText ? ` ${statusText}` : ''}${plain ? `: ${clip(plain, MAX_SHOWN)}` : ''}`,
    hint: status === 502 || status === 503 || status === 504 ? 'The Proxy or something in front of it could not answer; try again, and check the Proxy is running.' : '',
  };
}

/** The failure of a request that got no answer at all. */
export function unreachable(cause: unknown): ApiFailure {
  return {
    status: 0,
    code: '',
    message: `the Proxy could not be reached: ${cause instanceof Error ? cause.message : String(cause)}`,
    hint: 'Check the network connection and that the Proxy is running, then reload the page.',
  };
}

/**
 * Failures after which the data on the screen is no longer the user's to see: the request was refused as the user
 * (401: the session or its certificate is gone; 403: a lock, a role taken away). The page clears it from under
 * the error; any other failure (the Proxy unreachable, a 5xx) leaves the last answer on screen with the error.
 */
export function clearsData(f: Partial<Pick<ApiFailure, 'status'>>): boolean {
  return f.status === 401 || f.status === 403;
}

/** Codes after which the page goes back to the sign-in page, and what it says there. */
export function signInReason(f: Pick<ApiFailure, 'status' | 'code'>): 'expired' | 'signed-out' | undefined {
  if (f.code === 'GW_ERR_WEB_SESSION_EXPIRED') return 'expired';
  if (f.code === 'GW_ERR_WEB_SESSION_MISSING' || f.code === 'GW_ERR_WEB_SESSION_INVALID') return 'signed-out';
  return undefined;
}
