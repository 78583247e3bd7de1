"""The core every capability uses: settings, the tenant transaction, the request's costs and limits, flights, timing, the candidate type."""
