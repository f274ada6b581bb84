# frozen_string_literal: true

require "securerandom"
require "erb"
require "rack/utils"

module IdempotentJob
  class Web
    # CSRF protection of the standalone page: a random token kept in the visitor's Rack
    # session (`env["rack.session"]`, e.g. Rails' session or `Rack::Session::Cookie`),
    # put in every form, and compared in constant time on every POST. Inside Sidekiq
    # Web, Sidekiq's own protection applies instead (see {SidekiqTab}).
    module CsrfToken
      # The form field (the name Rails and Sidekiq Web use too).
      FIELD = "authenticity_token"
      # The session key the token is kept under.
      SESSION_KEY = "idempotent_job.csrf_token"
      # Why a page without a session cannot change anything.
      NO_SESSION = "there is no Rack session (env[\"rack.session\"]) to keep a CSRF token in: mount the " \
                   "page inside your Rails routes, or put a session middleware such as Rack::Session::Cookie " \
                   "in front of it; until then it is read-only"

      class << self
        # @param env [Hash] the Rack environment
        # @return [Boolean] whether the request has a Rack session
        def session?(env)
          !env["rack.session"].nil?
        end

        # The session's token, created on first use (writes the session).
        # @param env [Hash] the Rack environment
        # @return [String, nil] nil without a session
        def token(env)
          session = env["rack.session"] or return nil
          session[SESSION_KEY] ||= SecureRandom.urlsafe_base64(32)
        end

        # @param env [Hash] the Rack environment
        # @return [String] the hidden form field carrying the token ("" without a session)
        def field(env)
          value = token(env) or return ""
          %(<input type="hidden" name="#{FIELD}" value="#{ERB::Util.html_escape(value)}">)
        end

        # @param env [Hash] the Rack environment
        # @param given [String, nil] the token the form sent
        # @return [Boolean] true when the session has a token and `given` equals it
        def valid?(env, given)
          expected = env["rack.session"]&.[](SESSION_KEY)
          return false unless expected.is_a?(String) && given.is_a?(String) && given.bytesize == expected.bytesize

          ::Rack::Utils.secure_compare(expected, given)
        end
      end
    end
  end
end
